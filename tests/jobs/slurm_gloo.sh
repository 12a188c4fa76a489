#!/bin/bash
# A multi-node gloo job under Slurm: one rank per task, RANK/LOCAL_RANK/WORLD_SIZE from
# Slurm's task ids (as torchrun would set them), all blocked in a barrier that never ends.
# Usage: sbatch [options] slurm_gloo.sh PYTHON RANK_SCRIPT READY_DIR MASTER_PORT
set -eu
PY=$1 SCRIPT=$2 READY=$3 PORT=$4
export MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1
exec srun --kill-on-bad-exit=0 bash -c \
  'RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS exec "$0" "$@"' \
  "$PY" "$SCRIPT" "$READY"
