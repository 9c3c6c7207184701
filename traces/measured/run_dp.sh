#!/usr/bin/env bash
# Data-parallel gradient compression at an emulated 100 Mbps (netns + tc; needs root):
# gpt2-tiny, 2 replicas, no pipeline; fp32 allreduce (AdamW) vs QSGD-MaxNorm 4-bit (AdamW) vs
# 1-bit LAMB (10 warm-up steps), and LAMB with fp32 allreduce throughout (warm-up longer than the run)
# as the loss baseline of 1-bit LAMB.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
WORK="${WORK:-/tmp/perfsim-evidence}"
keep() {
  mkdir -p "$2"
  cp "$1"/summary.csv "$1"/stages.csv "$1"/losses.csv "$1"/result.json "$2"/
}
for g in none qsgd-maxnorm:4 onebit-lamb:warmup=10 onebit-lamb:warmup=100000; do
  name="dp-gpt2-tiny-${BW:-100Mbps}-${g//[:=]/-}"
  perfsim run --model gpt2-tiny --pp 1 --dp 2 --micro-batch 16 --macro-batch 16 \
    --dataset-limit 1024 --steps "${DSTEPS:-40}" --seed 0 --lr 1e-3 --grad-compress "$g" \
    --emulate-bandwidth "${BW:-100Mbps}" --out "$WORK/$name" --no-progress
  keep "$WORK/$name" "$HERE/dp/$name"
done
