#!/bin/bash
# torchrun under srun: two tasks on one node, each a torchrun launcher (SLURM_PROCID 0 and
# 1) of one 5-rank gloo job (3 workers + 2 workers, RANK set by torchrun), all blocked in
# a barrier that never ends. The launchers carry SLURM_PROCID but are not ranks.
# Usage: sbatch [options] slurm_torchrun.sh PYTHON RANK_SCRIPT READY_DIR RDZV_PORT
set -eu
PY=$1 SCRIPT=$2 READY=$3 PORT=$4
export GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1
exec srun --kill-on-bad-exit=0 bash -c \
  'exec "$0" -m torch.distributed.run --nnodes=2 --nproc-per-node=$((3 - SLURM_PROCID)) \
     --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:'"$PORT"' --rdzv-id=launchers "$@"' \
  "$PY" "$SCRIPT" "$READY"
