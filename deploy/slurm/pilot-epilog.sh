#!/usr/bin/env bash
# Slurm Epilog for pilot (slurm.conf: Epilog=/usr/lib/pilot/slurm/pilot-epilog.sh; run as root on
# the node when a job ends, is cancelled or times out). `pilotctl job end` unregisters the job:
# its GPU allow-list goes first (no new session of it is served), then its pilot sessions end
# (their memory is freed at once, and any process of the job still alive gets errors from its
# CUDA calls) and its quota and share are removed. Same environment as pilot-prolog.sh. In user
# mode (PILOT_SLURM_TENANT=user) it does nothing: the user's other jobs may still run.
set -u
[ -r /etc/default/pilot-slurm ] && . /etc/default/pilot-slurm
PILOTCTL=${PILOTCTL:-pilotctl}
MODE=${PILOT_SLURM_TENANT:-job}
job=${SLURM_JOB_ID:?slurmd sets SLURM_JOB_ID}
[ "$MODE" = user ] && exit 0
if ! out=$("$PILOTCTL" job end "$job" 2>&1); then
    echo "pilot-epilog: job $job: pilotctl job end failed: $out" >&2
    exit 0
fi
echo "pilot-epilog: job $job: $out" >&2
exit 0
