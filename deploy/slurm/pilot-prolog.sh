#!/usr/bin/env bash
# Slurm Prolog for pilot (slurm.conf: Prolog=/usr/lib/pilot/slurm/pilot-prolog.sh; slurmd runs it
# as root on the node when a job starts there). It gives the job's tenant a device-memory quota
# derived from what the job asked Slurm for:
#
#   each unit of the job's `pilotmem` GRES (--gres=pilotmem:N) is one MiB of GPU memory per GPU
#   pilot serves on the node, so `srun --gres=pilotmem:8192 ...` gets an 8 GiB hard quota;
#   a job without it gets PILOT_SLURM_DEFAULT (default: no quota of its own).
#
# The tenant is `slurm:job_<id>` (pilotd's `[slurm] job_tenants = true`: pilotd finds a
# program's job from the process tree, not from anything the job says), or with
# PILOT_SLURM_TENANT=user the job user's tenant `user:<name>` (then concurrent jobs of one
# user share one quota, the last prolog's). deploy/README.md walks through the set-up.
#
# Environment (from slurmd, or /etc/default/pilot-slurm): PILOTCTL (pilotctl), PILOT_CONTROL_SOCKET
# (pilotd's control socket), PILOT_SLURM_GRES (pilotmem), PILOT_SLURM_TENANT (job | user),
# PILOT_SLURM_DEFAULT (a size, e.g. 4GiB; empty: none).
#
# A prolog that fails drains the node, so this one never fails: what goes wrong is logged (stderr
# goes to slurmd's log) and the job runs; pilotd down means the job's programs get no GPU.
set -u
[ -r /etc/default/pilot-slurm ] && . /etc/default/pilot-slurm
PILOTCTL=${PILOTCTL:-pilotctl}
GRES=${PILOT_SLURM_GRES:-pilotmem}
MODE=${PILOT_SLURM_TENANT:-job}
DEFAULT=${PILOT_SLURM_DEFAULT:-}
job=${SLURM_JOB_ID:?slurmd sets SLURM_JOB_ID}

if [ "$MODE" = user ]; then
    tenant="user:${SLURM_JOB_USER:?slurmd sets SLURM_JOB_USER}"
else
    tenant="slurm:job_$job"
fi

# The job's request, as slurmctld has it: TresPerNode=gres:pilotmem:N (or gres/pilotmem=N).
info=$(scontrol show job "$job" -o 2>/dev/null)
mib=$(printf '%s\n' "$info" | grep -oE "gres[:/]$GRES[:=][0-9]+" | head -1 | grep -oE '[0-9]+$')
if [ -n "$mib" ]; then
    size="${mib}MiB"
elif [ -n "$DEFAULT" ]; then
    size=$DEFAULT
else
    echo "pilot-prolog: job $job asked for no $GRES; $tenant has no quota of its own" >&2
    exit 0
fi
if ! out=$("$PILOTCTL" quota set "$tenant" "$size" 2>&1); then
    echo "pilot-prolog: job $job: pilotctl quota set $tenant $size failed: $out" >&2
    exit 0
fi
echo "pilot-prolog: job $job: $tenant quota $size" >&2
exit 0
