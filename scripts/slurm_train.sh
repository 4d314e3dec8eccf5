#!/bin/bash
# Multi-node training on SLURM: one torchrun per node, 8 GPUs each, safe against time limits
# and pre-emption.
#
#   sbatch --nodes=2 scripts/slurm_train.sh config/openwebtext_l.py --connection=p_spheret --spheret_p=0.5
#
# Three minutes before the time limit SLURM signals this script (USR1); it forwards USR1 through
# srun and torchrun to every worker, the workers finish the current step, write ckpt.pt and
# exit 0, and the script requeues the job. A requeued job (SLURM_RESTART_COUNT > 0) resumes
# from out_dir/ckpt.pt. Pre-emption by another job sends SIGTERM, which does the same.
# The global batch stays 128 sequences whatever --nodes is (gradient accumulation adapts).
#SBATCH --job-name=spheretnorm
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --time=24:00:00
#SBATCH --signal=B:USR1@180
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-%x-%j.out
set -uo pipefail

CONFIG=${1:?usage: sbatch scripts/slurm_train.sh config/NAME.py [--key=value ...]}
shift
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_PORT=${MASTER_PORT:-29500}
if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then INIT=resume; else INIT=scratch; fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}

STOPPING=0
trap 'echo "time limit near: asking the workers to checkpoint"; STOPPING=1; kill -USR1 "$SRUN_PID"' USR1

srun --kill-on-bad-exit=1 torchrun \
  --nnodes="$SLURM_JOB_NUM_NODES" \
  --nproc_per_node="$GPUS_PER_NODE" \
  --rdzv_id="$SLURM_JOB_ID" \
  --rdzv_backend=c10d \
  --rdzv_endpoint="$MASTER_ADDR:$MASTER_PORT" \
  --signals_to_handle=SIGTERM,SIGINT,SIGUSR1 \
  --shutdown_timeout=150 \
  train.py "$CONFIG" --init_from="$INIT" "$@" &
SRUN_PID=$!

# `wait` returns early when the trap runs; wait again for srun's own exit status.
wait "$SRUN_PID"
STATUS=$?
while kill -0 "$SRUN_PID" 2>/dev/null; do
  wait "$SRUN_PID"
  STATUS=$?
done

if [ "$STOPPING" = 1 ]; then
  echo "checkpoint written; requeueing job $SLURM_JOB_ID"
  scontrol requeue "$SLURM_JOB_ID"
fi
exit "$STATUS"
