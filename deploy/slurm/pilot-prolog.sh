#!/usr/bin/env bash
# Slurm Prolog for pilot (slurm.conf: Prolog=/usr/lib/pilot/slurm/pilot-prolog.sh, PrologFlags=Alloc;
# slurmd runs it as root on the node when a job starts there, before any of its steps). It
# registers the job with pilotd (`pilotctl job start`), which from then on serves the job's
# programs, tenant `slurm:job_<id>` (pilotd's `[slurm] job_tenants = true`: pilotd finds a
# program's job from the process tree, not from anything the job says), with:
#
#   GPUs   the job's `gpu` GRES on this node (SLURM_JOB_GPUS: Slurm's indexes, which are the
#          GPUs' indexes in PCI bus order when gres.conf lists /dev/nvidia0, 1, ... in order or
#          AutoDetect=nvml; PILOT_SLURM_GPU_ORDER=pilot takes them as pilotd's GPU numbers).
#          pilotd lets the job's programs see those GPUs only, renumbered from 0, whatever their
#          CUDA_VISIBLE_DEVICES says. A job with no `gpu` GRES gets PILOT_SLURM_NO_GPU: none
#          (default: its programs get no GPU, as under ConstrainDevices) or all (every GPU pilotd
#          serves, shared with the other jobs; for nodes scheduled by `pilotmem` alone).
#   quota  each unit of the job's `pilotmem` GRES (--gres=pilotmem:N) is one MiB of GPU memory,
#          a hard quota on each of its GPUs: `--gres=gpu:1,pilotmem:8192` gets 8 GiB; a job
#          without it gets PILOT_SLURM_DEFAULT (a size, e.g. 4GiB; empty: no quota of its own).
#   share  its `pilotshare` GRES (--gres=pilotshare:N): N percent of each GPU's SMs (none: the
#          whole GPU, as far as other shares leave it).
#
# With PILOT_SLURM_TENANT=user the job runs as its user's tenant `user:<name>` instead (pilotd's
# job_tenants off): then only the quota is set (concurrent jobs of a user share one, the last
# prolog's) and the GPUs are not confined by pilotd. deploy/README.md walks through the set-up.
#
# Environment (from slurmd, or /etc/default/pilot-slurm): PILOTCTL (pilotctl), PILOT_CONTROL_SOCKET
# (pilotd's control socket), PILOT_SLURM_GRES (pilotmem), PILOT_SLURM_SHARE_GRES (pilotshare),
# PILOT_SLURM_TENANT (job | user), PILOT_SLURM_DEFAULT, PILOT_SLURM_NO_GPU (none | all),
# PILOT_SLURM_GPU_ORDER (pci | pilot).
#
# A prolog that fails drains the node, so this one never fails: what goes wrong is logged (stderr
# goes to slurmd's log) and the job runs; a job pilotd has not registered gets no GPU from it.
set -u
[ -r /etc/default/pilot-slurm ] && . /etc/default/pilot-slurm
PILOTCTL=${PILOTCTL:-pilotctl}
GRES=${PILOT_SLURM_GRES:-pilotmem}
SHARE_GRES=${PILOT_SLURM_SHARE_GRES:-pilotshare}
MODE=${PILOT_SLURM_TENANT:-job}
DEFAULT=${PILOT_SLURM_DEFAULT:-}
NO_GPU=${PILOT_SLURM_NO_GPU:-none}
ORDER=${PILOT_SLURM_GPU_ORDER:-pci}
job=${SLURM_JOB_ID:?slurmd sets SLURM_JOB_ID}

# The job's request, as slurmctld has it: TresPerNode=gres:pilotmem:N (or gres/pilotmem=N).
info=$(scontrol show job "$job" -o 2>/dev/null)
count_of() {
    printf '%s\n' "$info" | grep -oE "gres[:/]$1[:=][0-9]+" | head -1 | grep -oE '[0-9]+$'
}
mib=$(count_of "$GRES")
if [ -n "$mib" ]; then
    size="${mib}MiB"
else
    size=$DEFAULT
fi

if [ "$MODE" = user ]; then
    tenant="user:${SLURM_JOB_USER:?slurmd sets SLURM_JOB_USER}"
    if [ -z "$size" ]; then
        echo "pilot-prolog: job $job asked for no $GRES; $tenant has no quota of its own" >&2
    elif ! out=$("$PILOTCTL" quota set "$tenant" "$size" 2>&1); then
        echo "pilot-prolog: job $job: pilotctl quota set $tenant $size failed: $out" >&2
    else
        echo "pilot-prolog: job $job: $tenant quota $size" >&2
    fi
    exit 0
fi

gpus=${SLURM_JOB_GPUS:-}
order=()
if [ -z "$gpus" ]; then
    gpus=$NO_GPU
elif [ "$ORDER" = pci ]; then
    order=(--pci-order)
fi
args=(job start "$job" --gpus "$gpus" "${order[@]}")
[ -n "$size" ] && args+=(--mem "$size")
share=$(count_of "$SHARE_GRES")
[ -n "$share" ] && args+=(--share "$share")
if ! out=$("$PILOTCTL" "${args[@]}" 2>&1); then
    echo "pilot-prolog: job $job: pilotctl ${args[*]} failed, its programs get no GPU: $out" >&2
    exit 0
fi
echo "pilot-prolog: job $job: $out" >&2
exit 0
