#!/usr/bin/env bash
# One short, prepared pass over the GPU checks perfsim needs (docs/gpu.md), for a lent
# machine with torch + CUDA and no package registry. Writes into $OUT (default ./gpu-out):
#   env.txt        device, driver, torch / CUDA / Triton versions
#   tests.txt      the CUDA byte-exactness tests (pytest -m gpu) and the byte diff
#   efficiency.json  perfsim calibrate --efficiency: GEMM by shape, attention, norm, GELU, AdamW
#   layers.json    per-layer forward / backward / optimizer of GPT-2 models in bf16
#   codecs.json    the compressors' encode / decode on the GPU
#   run.tgz        a single-GPU perfsim run (execute mode) and the log of every step
# Each step has its own time limit, so one that overruns loses only its own file.
# simpy is not on the lent machines: carry its wheel in .whl (docs/gpu.md says how).
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
. "$(dirname "$0")/gpu_steps.sh"
install_wheels .whl
gpu_env
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/logs/install.log" 2>&1
step tests 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/kernels/test_kernels.py tests/compression/test_maxnorm.py \
    tests/kernels/test_lanes.py
cp "$OUT/logs/tests.log" "$OUT/tests.txt"
step byte_diff 40 python3 scripts/gpu_byte_diff.py
cat "$OUT/logs/byte_diff.log" >> "$OUT/tests.txt"
step efficiency 110 python3 -m perfsim calibrate --device cuda --model '' --stages '' --comm none --codecs none \
    --ranks 1 --efficiency bfloat16,float16,float32,tf32 --no-progress -o "$OUT/efficiency.json"
step layers 140 python3 -m perfsim calibrate --device cuda --model gpt2-medium,gpt2-large,gpt2 --micro-batch 1,2,4,8 \
    --dtype bfloat16 --stages '' --comm none --codecs none --ranks 1 --no-progress -o "$OUT/layers.json"
step codecs 60 python3 -m perfsim calibrate --device cuda --model '' --stages '' --comm none --codecs all --ranks 1 \
    --quick --no-progress -o "$OUT/codecs.json"
step run 60 python3 -m perfsim run --device cuda --model gpt2-small-byte --pp 1 --dp 1 --steps 20 --no-progress \
    -o "$OUT/run1"
tar czf "$OUT/run.tgz" -C "$OUT" --exclude=ckpt logs run1 2>/dev/null
rm -rf "$OUT/run1" "$OUT/logs"
