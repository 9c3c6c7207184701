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
mkdir -p "$OUT" "$OUT/logs"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    python3 -c "import torch, triton; p = torch.cuda.get_device_properties(0); \
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, \
'nccl', torch.cuda.nccl.version()); print(p.name, p.multi_processor_count, 'SMs', \
round(p.total_memory / 2**30, 1), 'GiB')"
} > "$OUT/env.txt" 2>&1
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/logs/install.log" 2>&1
step() {  # step NAME SECONDS COMMAND...
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$OUT/logs/$name.log" 2>&1
    echo "step $name: exit $? in $((SECONDS - t0)) s" | tee -a "$OUT/env.txt"
}
step tests 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_kernels.py tests/test_maxnorm.py \
    tests/test_lanes.py
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
