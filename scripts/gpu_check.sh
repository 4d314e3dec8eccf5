#!/usr/bin/env bash
# One GPU check of the fused sphere update, sized for a short lease on one H100/H200
# (about 8 minutes): the kernel tests on CUDA (Triton kernels compiled, not interpreted),
# then bench.py at the paper's S scale (12 x 768, block 1024, batch 16, bf16), eager and
# compiled, every sphere method beside pre_ln, with MFU. Prints one table per mode.
#
#   bash scripts/gpu_check.sh            # from the repository root, torch with CUDA + triton
#   OUT=results/ bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_check}
mkdir -p "$OUT"
python -c "import torch, triton; assert torch.cuda.is_available(); print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"

echo "== kernel tests on CUDA =="
timeout 240 python -m pytest -q -x tests/test_sphere_kernels.py -k "compiled_model or inductor_compiled or (bf16 and triton and mixed) or (fp32 and triton and capped)" \
  2>&1 | tail -5

S="config/openwebtext_s.py --batch_size=16 --dtype=bfloat16 --device=cuda"
echo "== bench: eager (the paper trains eagerly) =="
timeout 200 python bench.py $S --compile=False --steps=15 --warmup=3 \
  --connections=pre_ln,geonorm,proj_spheret,cay_spheret,p_spheret --sphere_impl=reference,auto \
  --json="$OUT/bench_eager.json" 2>/dev/null | grep '^|'
echo "== bench: compiled =="
timeout 300 python bench.py $S --compile=True --steps=15 --warmup=3 \
  --connections=pre_ln,p_spheret,geonorm --sphere_impl=auto \
  --json="$OUT/bench_compiled.json" 2>/dev/null | grep '^|'
