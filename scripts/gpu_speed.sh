#!/usr/bin/env bash
# Step time and MFU of every connection at the paper's S (or M: SCALE=m) shape on one GPU, compiled
# per block (compile_scope=blocks; COMPILE_SCOPE=model for the whole-model graph, train.py's
# choice under DDP by default: run both, the CPU's step favoured model by 7-10%), bf16:
# both blocks under AdamW, Pre-LN and 0.5-SpheretNorm under Muon too (its step does not depend
# on the connection), then a profile of the slowest compiled connection. One block per call of
# about 10 minutes on an H100/H200 (BLOCKS=gpt2, then BLOCKS=llama: both blocks in one call did
# not fit 600 s on 2026-12-04, see docs/LOG.md), every part bounded by its own timeout:
#   1. warm torch.compile's caches: one process per (block, connection), a few at a time, one
#      step each (compilation is CPU work); each process's wall time, its cold compile included,
#      is logged as 'compile+1 step' (an upper bound of the compile: they run a few at a time);
#   2. bench.py per block, every connection in one process, timed round-robin from warm caches;
#   3. Muon: Pre-LN and 0.5-SpheretNorm in both blocks;
#   4. bench.py --profile on the slowest connection of part 2 beside Pre-LN.
#
#   BLOCKS=gpt2 bash scripts/gpu_speed.sh        # torch with CUDA; BLOCKS="gpt2 llama" for both
#   OUT=results/ BLOCKS=llama bash scripts/gpu_speed.sh   # where the log and the JSON go
#   SCALE=m BLOCKS=gpt2 bash scripts/gpu_speed.sh         # the paper's M shape (24 x 1024)
#   LADDER="16 32 48" bash scripts/gpu_speed.sh          # only a micro-batch ladder (the MFU work):
#      Pre-LN and 0.5-SpheretNorm at each batch, step time, MFU and peak memory, one process a batch
set -uo pipefail
if [[ " $* " == *" --help "* || " $* " == *" -h "* ]]; then
  sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 0
fi
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_speed}
mkdir -p "$OUT"
PY=$(command -v python || command -v python3)
export PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/spheretnorm_inductor}
BLOCKS=${BLOCKS:-gpt2}
SCALE=${SCALE:-s}
COMPILE_SCOPE=${COMPILE_SCOPE:-blocks}
WARM_AT_ONCE=${WARM_AT_ONCE:-5}  # at most ~20 GB of GPU memory each at S, batch 16
S="config/openwebtext_${SCALE}.py --batch_size=16 --dtype=bfloat16 --device=cuda --compile=True --compile_scope=$COMPILE_SCOPE"
CONNECTIONS=$("$PY" -c "from spheretnorm.model import CONNECTIONS; print(' '.join(CONNECTIONS))") || exit 1
section() { echo; echo "== $1 == ($(date +%T))"; }

section "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c "import torch, triton; print('torch', torch.__version__, '| triton', triton.__version__, '|', torch.cuda.get_device_name())" || exit 1

LADDER=${LADDER:-}
if [ -n "$LADDER" ]; then  # the micro-batch ladder alone: about 150 s a batch from a cold cache
  for bs in $LADDER; do
    section "micro-batch $bs: pre_ln and p_spheret, $BLOCKS"
    timeout 170 "$PY" bench.py ${S/--batch_size=16/--batch_size=$bs} --blocks="${BLOCKS// /,}" --connections=pre_ln,p_spheret \
      --steps=8 --warmup=2 --json="$OUT/bench_ladder_$bs.json" 2>>"$OUT/stderr.log" | grep '^|' || echo "  batch $bs: failed or timed out (see stderr.log)"
  done
  section "done"
  exit 0
fi

section "1. warm the compile caches ($WARM_AT_ONCE at a time)"
warm() {
  local start=$SECONDS
  timeout 240 "$PY" bench.py $S --blocks="$1" --connections="$2" --steps=1 --warmup=1 >/dev/null 2>>"$OUT/warm.log" \
    && echo "  warm: $1 $2, compile+1 step $((SECONDS - start)) s" || echo "  warm: $1 $2 FAILED or timed out (see warm.log)"
}
export -f warm
export PY S OUT
for block in $BLOCKS; do for c in $CONNECTIONS; do echo "$block $c"; done; done \
  | timeout 200 xargs -P "$WARM_AT_ONCE" -L 1 bash -c 'warm "$0" "$1"'

# From warm caches a Euclidean connection compiles in 2-4 s, a sphere one (Triton ops) in 15-17 s,
# nGPT in over 50 s (2026-12-04): 240 s for the eleven.
for block in $BLOCKS; do
  section "2. bench, $block block: every connection under AdamW"
  timeout 240 "$PY" bench.py $S --blocks=$block --connections=all --steps=10 --warmup=2 \
    --json="$OUT/bench_${block}_adamw.json" 2>>"$OUT/stderr.log" | grep '^|'
done

section "3. bench: Muon, pre_ln and p_spheret"
timeout 80 "$PY" bench.py $S --blocks="${BLOCKS// /,}" --connections=pre_ln,p_spheret --optimizers=muon --steps=10 --warmup=2 \
  --json="$OUT/bench_muon.json" 2>>"$OUT/stderr.log" | grep '^|'

section "4. profile of the slowest compiled connection beside pre_ln"
slowest=$("$PY" - "$OUT" <<'EOF'
import json, sys, pathlib
rows = []
for f in pathlib.Path(sys.argv[1]).glob("bench_*_adamw.json"):
    rows += json.loads(f.read_text())["results"]
rows = [r for r in rows if r.get("ms_per_step")]
slow = max(rows, key=lambda r: r["ms_per_step"])
print(slow["block"], slow["method"].split(":")[0])
EOF
) || slowest=""
if [ -n "$slowest" ]; then
  read -r block conn <<<"$slowest"
  timeout 70 "$PY" bench.py $S --blocks=$block --connections=pre_ln,$conn --steps=5 --warmup=2 --profile=3 \
    --json="$OUT/profile.json" 2>>"$OUT/stderr.log" | grep -v '^  row'
fi
section "done"
