#!/usr/bin/env bash
# Slurm Epilog for pilot (slurm.conf: Epilog=/usr/lib/pilot/slurm/pilot-epilog.sh; run as root on
# the node when a job ends, is cancelled or times out). It ends the job's pilot sessions (their
# memory is freed at once, and any process of the job still alive gets errors from its CUDA
# calls) and removes the quota the prolog set. Same environment as pilot-prolog.sh. In user mode
# (PILOT_SLURM_TENANT=user) it does neither: the user's other jobs may still run.
set -u
[ -r /etc/default/pilot-slurm ] && . /etc/default/pilot-slurm
PILOTCTL=${PILOTCTL:-pilotctl}
MODE=${PILOT_SLURM_TENANT:-job}
job=${SLURM_JOB_ID:?slurmd sets SLURM_JOB_ID}
[ "$MODE" = user ] && exit 0
tenant="slurm:job_$job"
out=$("$PILOTCTL" kill --tenant "$tenant" 2>&1) || echo "pilot-epilog: job $job: $out" >&2
echo "pilot-epilog: job $job: $out" >&2
"$PILOTCTL" quota unset "$tenant" >/dev/null 2>&1 || true
exit 0
