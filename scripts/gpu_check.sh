#!/usr/bin/env bash
# One GPU check of the fused sphere update, sized for a short lease on one H100/H200 (under
# 10 minutes, every part bounded by its own timeout so that one failure leaves the rest):
#   1. the kernel tests on CUDA (the Triton kernels compiled, not interpreted; the fused
#      update compiled by inductor for CUDA; whole models under torch.compile);
#   2. bench.py at the paper's S scale (12 x 768, block 1024, batch 16, bf16), eager with
#      the reference and the fused update of every sphere method beside pre_ln, with MFU;
#   3. the same compiled;
#   3b. every optimizer's step time and share of a training step at S (AdamW, Muon, AdamH, MuonH;
#      Newton-Schulz in bf16 on CUDA), eager;
#   4. train.py through torchrun on Shakespeare characters (Pre-LN and 0.5-SpheretNorm, a
#      few hundred iterations, with evaluations, diagnostics and checkpoints).
#
#   bash scripts/gpu_check.sh                    # from anywhere; torch with CUDA + triton
#   OUT=results/ bash scripts/gpu_check.sh       # where the log, JSON and metrics go
# Needs data/shakespeare_char prepared (python data/prepare.py shakespeare_char) for part 4.
set -uo pipefail
if [[ " $* " == *" --help "* || " $* " == *" -h "* ]]; then
  sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'  # this header, and nothing run
  exit 0
fi
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_check}
mkdir -p "$OUT"
PY=$(command -v python || command -v python3)
export PYTHONUNBUFFERED=1
status=0
section() { echo; echo "== $1 == ($(date +%T))"; }
note_rc() { local rc=$1 what=$2; [ "$rc" -eq 0 ] || { echo "!! $what ended with status $rc"; status=1; }; }

section "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c "import torch, triton; assert torch.cuda.is_available(); print('torch', torch.__version__, '| triton', triton.__version__, '|', torch.cuda.get_device_name())" || exit 1

section "kernel tests on CUDA"
timeout 150 "$PY" -m pytest -q -p no:cacheprovider tests/test_sphere_kernels.py \
  -k "triton or compiled_model or inductor_compiled or training_reference" 2>&1 | tail -15
note_rc $? "the kernel tests"

S="config/openwebtext_s.py --batch_size=16 --dtype=bfloat16 --device=cuda --steps=15 --warmup=3"
section "bench: eager (the paper trains eagerly)"
timeout 150 "$PY" bench.py $S --compile=False \
  --connections=pre_ln,geonorm,proj_spheret,cay_spheret,p_spheret --sphere_impl=reference,auto \
  --json="$OUT/bench_eager.json" 2>>"$OUT/stderr.log" | grep '^|'
note_rc $? "the eager bench"

section "bench: compiled"
timeout 200 "$PY" bench.py $S --compile=True --connections=pre_ln,p_spheret,geonorm --sphere_impl=auto \
  --json="$OUT/bench_compiled.json" 2>>"$OUT/stderr.log" | grep '^|'
note_rc $? "the compiled bench"

section "bench: the optimizers at S (opt ms, opt share)"
timeout 120 "$PY" bench.py $S --compile=False --connections=pre_ln,p_spheret --sphere_impl=auto \
  --optimizers=adamw,muon,adamh,muonh --json="$OUT/bench_optimizers.json" 2>>"$OUT/stderr.log" | grep '^|'
note_rc $? "the optimizers' bench"

section "train.py under torchrun, bf16, eager"
for run in "pre_ln|--connection=pre_ln" "p_spheret-0.5|--connection=p_spheret --spheret_p=0.5"; do
  run_dir="$OUT/train_${run%%|*}"
  timeout 40 "$PY" -m torch.distributed.run --standalone --nproc_per_node=1 train.py config/shakespeare_char.py \
    ${run#*|} --max_iters=300 --lr_decay_iters=300 --eval_interval=100 --log_interval=100 \
    --out_dir="$run_dir" 2>&1 | grep -E "^(iter|eval iter|Done)|Error|error" | tail -8
  note_rc $? "train.py ${run#*|}"
  find "$run_dir" -type f ! -name metrics.jsonl -delete  # only the metrics come back
done

section "done"
exit $status
