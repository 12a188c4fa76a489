#!/bin/bash
# One role of an AReaL job as AReaL's Slurm scheduler submits it (areal/infra/scheduler/
# slurm.py:825-967 at cbff54d6): one srun over the job's tasks, each `bash -c "...
# python -m areal.infra.rpc.rpc_server --experiment-name E --trial-name T --role R
# --name-resolve-type ... --nfs-record-root ... --etcd3-addr ... --fileroot ..."` with no
# --worker-index: the worker takes SLURM_PROCID (guard/app.py:565-571) and registers itself.
# The batch script streams every task's output into the role's log and, each line
# prefixed `[role]` padded to 10, merged.log, both in <fileroot>/logs/<user>/<E>/<T>
# (areal/infra/scheduler/slurm.py:168-188, 948-956; areal/infra/utils/proc.py:64-120;
# areal/utils/logging.py:24): the tee runs on the batch host, so on a shared file system
# every node sees the same two files.
# Usage: sbatch --job-name=E_T:R [options] areal_slurm_role.sh PYTHON STUB ROOT FILEROOT E T R
#        [MORE WORKER ARGUMENTS...]
set -eu
PY=$1 STUB=$2 ROOT=$3 FILEROOT=$4 EXP=$5 TRIAL=$6 ROLE=$7
shift 7
MORE="$*"
LOGS=$FILEROOT/logs/$(id -un)/$EXP/$TRIAL
mkdir -p "$LOGS"
PREFIX=$(printf '%-10s' "[$ROLE]")
export PYTHONPATH=$STUB AREAL_STUB_REGISTER=1 OMP_NUM_THREADS=1
srun --kill-on-bad-exit=0 bash -c "$PY -m areal.infra.rpc.rpc_server --experiment-name $EXP --trial-name $TRIAL --role $ROLE --name-resolve-type nfs --nfs-record-root $ROOT --etcd3-addr localhost:2379 --fileroot $FILEROOT $MORE" \
  2>&1 | tee -a "$LOGS/$ROLE.log" >(stdbuf -oL sed "s/^/$PREFIX/" >> "$LOGS/merged.log")
