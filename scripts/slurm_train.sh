#!/bin/bash
# Multi-node training on SLURM: one torchrun per node, 8 GPUs each, safe against time limits
# and pre-emption, with any torch the project supports (>= 2.4).
#
#   sbatch --nodes=2 scripts/slurm_train.sh config/openwebtext_l.py --connection=p_spheret --spheret_p=0.5
#
# Three minutes before the time limit SLURM signals this script (USR1); it forwards USR1 through
# srun to every node, the workers finish the current step, write ckpt.pt and exit 0, and the
# script requeues the job. Pre-emption by another job sends SIGTERM, which does the same.
# train.py runs with --init_from=auto (unless the arguments choose another --init_from): a requeued
# job (SLURM_RESTART_COUNT > 0), or any job whose out_dir already holds ckpt.pt, resumes from it;
# otherwise training starts from scratch.
# Threads: each of the node's GPUS_PER_NODE workers gets OMP_NUM_THREADS = SLURM_CPUS_PER_TASK /
# GPUS_PER_NODE (at least 1; SLURM_CPUS_ON_NODE when no --cpus-per-task was given), unless
# OMP_NUM_THREADS is set already. srun gets --cpus-per-task itself (SLURM >= 22.05 no longer
# hands it down from sbatch) and --export=ALL, so the threads and the user's variables (the
# offline ones: HF_HUB_OFFLINE, HF_DATASETS_OFFLINE, TRANSFORMERS_OFFLINE, WANDB_MODE) reach
# every worker even when the job was submitted with --export=NONE.
# Run outside a SLURM job, it prints its usage and exits 2.
#
# How USR1 reaches the workers depends on the torchrun found on PATH:
#  - torch >= 2.10: torchrun itself forwards it (--signals_to_handle) and gives the workers
#    --shutdown_timeout seconds to checkpoint.
#  - torch 2.4-2.9: torchrun has neither flag, and a USR1 would kill torchrun itself (it leaves the
#    signal at its default action) before the workers could save. So each node runs torchrun
#    under a small shell that starts it with USR1 ignored and hands USR1 and TERM straight to
#    its children, the train.py workers.
# The global batch stays 128 sequences whatever --nodes is (gradient accumulation adapts).
#
# Clusters differ: give partition, account, QOS, time limit, CPUs and any other option on the
# sbatch command line or in SLURM's SBATCH_* variables; both win over the #SBATCH defaults below
# (which set no time limit or CPU count, so the partition's own defaults apply):
#   sbatch --partition=gpu --account=lab --qos=high --time=12:00:00 --cpus-per-task=16 scripts/slurm_train.sh ...
#   SBATCH_PARTITION=gpu SBATCH_ACCOUNT=lab SBATCH_TIMELIMIT=12:00:00 sbatch scripts/slurm_train.sh ...
#   python scripts/launch.py --mode slurm --sbatch_args "--partition=gpu --account=lab --time=12:00:00"
#SBATCH --job-name=spheretnorm
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --signal=B:USR1@180
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-%x-%j.out
set -uo pipefail

SIGNAL_FLAGS=(--signals_to_handle=SIGTERM,SIGINT,SIGUSR1 --shutdown_timeout=150)

# True when the torchrun on PATH accepts --signals_to_handle and --shutdown_timeout (torch >= 2.10).
# The help text is captured first: `torchrun --help | grep -q` could end torchrun with SIGPIPE,
# which pipefail would report as "flag missing".
torchrun_has_signal_flags() {
  local usage
  usage=$(torchrun --help 2>&1) || true
  [[ $usage == *--signals_to_handle* && $usage == *--shutdown_timeout* ]]
}

# Exit status of background process $1, waiting again whenever a trap interrupts `wait`.
wait_for_exit() {
  local pid=$1
  while kill -0 "$pid" 2>/dev/null; do
    wait "$pid"
  done
  wait "$pid"  # bash keeps the status of a reaped child, so this returns the real one
}

# One node's launcher for a torchrun without signal flags: runs "$@" (the torchrun command) with
# USR1 ignored, and forwards USR1/TERM from srun to the processes torchrun started. train.py
# installs its own handlers, so the inherited "ignore" does not stop the workers from saving.
run_node_forwarding_signals() {
  (trap '' USR1; exec "$@") &
  LAUNCHER_PID=$!
  trap 'echo "node ${SLURM_NODEID:-?}: forwarding USR1 to the workers"; pkill -USR1 -P "$LAUNCHER_PID"' USR1
  trap 'echo "node ${SLURM_NODEID:-?}: forwarding TERM to the workers"; pkill -TERM -P "$LAUNCHER_PID"' TERM
  wait_for_exit "$LAUNCHER_PID"
}

USAGE="usage: sbatch [sbatch options] scripts/slurm_train.sh config/NAME.py [--key=value ...]"
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  echo "$USAGE"
  exit 0
fi
if [[ -z ${1:-} ]]; then
  echo "$USAGE" >&2
  exit 2
fi
if [[ -z ${SLURM_JOB_ID:-} || -z ${SLURM_JOB_NODELIST:-} ]]; then
  echo "$USAGE" >&2
  echo "error: this is not a SLURM job (SLURM_JOB_ID and SLURM_JOB_NODELIST are not set); submit the script with sbatch, or run train.py (under torchrun) directly." >&2
  exit 2
fi
CONFIG=$1
shift
if ! command -v torchrun >/dev/null 2>&1; then
  echo "error: torchrun is not on PATH; activate the environment that has torch before running sbatch." >&2
  exit 2
fi
# GPUs per node: what launch.py exported, else what SLURM allocated on this node, else 8.
GPUS_PER_NODE=${GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-8}}
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_PORT=${MASTER_PORT:-29500}

# CPU threads per worker: the task's CPUs shared among the node's workers, at least 1.
if [[ -n ${OMP_NUM_THREADS:-} ]]; then
  echo "threads: OMP_NUM_THREADS=$OMP_NUM_THREADS per worker (set before the job)"
else
  CPUS=${SLURM_CPUS_PER_TASK:-${SLURM_CPUS_ON_NODE:-}}
  [[ $CPUS =~ ^[0-9]+$ ]] || CPUS=$(nproc)
  WORKERS=$GPUS_PER_NODE
  [[ $WORKERS =~ ^[0-9]+$ && $WORKERS -gt 0 ]] || WORKERS=1
  OMP_NUM_THREADS=$((CPUS / WORKERS))
  ((OMP_NUM_THREADS >= 1)) || OMP_NUM_THREADS=1
  echo "threads: OMP_NUM_THREADS=$OMP_NUM_THREADS per worker ($CPUS CPUs per node task / $WORKERS workers)"
fi
export OMP_NUM_THREADS

SRUN_OPTIONS=(--kill-on-bad-exit=1 --export=ALL)
if [[ -n ${SLURM_CPUS_PER_TASK:-} ]]; then
  SRUN_OPTIONS+=(--cpus-per-task="$SLURM_CPUS_PER_TASK")
fi

OFFLINE=()
for name in HF_HUB_OFFLINE HF_DATASETS_OFFLINE TRANSFORMERS_OFFLINE WANDB_MODE; do
  [[ -n ${!name:-} ]] && OFFLINE+=("$name=${!name}")
done
((${#OFFLINE[@]})) && echo "offline settings for every worker: ${OFFLINE[*]}"

# One --init_from: auto, unless the arguments choose one (launch.py passes --init_from=auto itself).
# (A string, not an array: bash < 4.4 calls an empty array unbound under set -u.)
INIT_FROM=--init_from=auto
for arg in "$@"; do
  [[ $arg == --init_from=* || $arg == --init_from ]] && INIT_FROM=""
done
echo "job $SLURM_JOB_ID, restart ${SLURM_RESTART_COUNT:-0}: train.py ${INIT_FROM:-with the --init_from given}; --init_from=auto resumes if a checkpoint exists"

TORCHRUN=(
  torchrun
  --nnodes="${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}"
  --nproc_per_node="$GPUS_PER_NODE"
  --rdzv_id="$SLURM_JOB_ID"
  --rdzv_backend=c10d
  --rdzv_endpoint="$MASTER_ADDR:$MASTER_PORT"
)
if torchrun_has_signal_flags; then
  LAUNCH=("${TORCHRUN[@]}" "${SIGNAL_FLAGS[@]}")
else
  echo "torchrun has no --signals_to_handle (torch < 2.10): signals go to the workers through a per-node shell"
  # The function travels to every node as text: only this batch node has a copy of this script.
  NODE_SHELL="$(declare -f wait_for_exit run_node_forwarding_signals); run_node_forwarding_signals \"\$@\""
  LAUNCH=(bash -c "$NODE_SHELL" slurm-node "${TORCHRUN[@]}")
fi

STOPPING=0
SRUN_PID=""
# srun passes the signals it receives on to its tasks (torchrun, or the per-node shell).
trap 'echo "time limit near: asking the workers to checkpoint"; STOPPING=1; [ -n "$SRUN_PID" ] && kill -USR1 "$SRUN_PID"' USR1

srun "${SRUN_OPTIONS[@]}" "${LAUNCH[@]}" train.py "$CONFIG" ${INIT_FROM:+"$INIT_FROM"} "$@" &
SRUN_PID=$!

wait_for_exit "$SRUN_PID"
STATUS=$?

if [ "$STOPPING" = 1 ]; then
  echo "checkpoint written; requeueing job $SLURM_JOB_ID"
  scontrol requeue "$SLURM_JOB_ID"
fi
exit "$STATUS"
