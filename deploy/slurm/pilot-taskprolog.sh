#!/bin/sh
# Slurm TaskProlog for pilot, only on nodes WITHOUT cgroup.conf's ConstrainDevices=yes
# (slurm.conf: TaskProlog=/usr/lib/pilot/slurm/pilot-taskprolog.sh; slurmstepd runs it as the
# job's user before each task, and applies what it prints to the task's environment).
#
# pilotd shows a registered job its GPUs only, renumbered from 0, and reads CUDA_VISIBLE_DEVICES
# among them, as CUDA does inside a device cgroup. With ConstrainDevices=yes Slurm numbers
# CUDA_VISIBLE_DEVICES the same way (0, 1, ...); without it Slurm writes the node's indexes
# (e.g. 3 for the node's fourth GPU), which would select none of the job's GPUs. Unsetting the
# variable lets the job's programs see all of their job's GPUs, and pilotd still confines them.
echo "unset CUDA_VISIBLE_DEVICES"
echo "unset GPU_DEVICE_ORDINAL"
