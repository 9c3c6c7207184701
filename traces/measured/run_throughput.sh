#!/usr/bin/env bash
# Throughput of pipeline compression over emulated links (netns + tc; needs root).
# Two 4-stage configurations, 1F1B, AQ-SGD measured after its uncompressed first epoch:
#   gpt2-tiny  micro-batch 8 (a 64x128 fp32 activation = 256 KiB per sample group)
#   digits-mlp micro-batch 64 (compute per byte sent is tiny: communication dominates)
set -euo pipefail
# REP=k names the k-th repeat (the machine is shared: repeat and take medians)
HERE="$(cd "$(dirname "$0")" && pwd)"
WORK="${WORK:-/tmp/perfsim-evidence}"
keep() {
  mkdir -p "$2"
  cp "$1"/summary.csv "$1"/stages.csv "$1"/result.json "$2"/
}
for bw in ${BWS:-1Gbps 300Mbps 100Mbps}; do
  for c in fp32 directq:fw2bw4 aqsgd:fw2bw4 directq:fw4bw8 aqsgd:fw4bw8; do
    name="tput-gpt2-tiny-$bw-${c//:/-}-r${REP:-0}"
    perfsim run --model gpt2-tiny --pp 4 --schedule 1f1b --micro-batch 8 --macro-batch 32 \
      --dataset-limit 64 --steps "${TSTEPS:-10}" --seed 0 --compress "$c" \
      --emulate-bandwidth "$bw" --out "$WORK/$name" --no-progress
    keep "$WORK/$name" "$HERE/throughput/$name"
    name="tput-digits-mlp-$bw-${c//:/-}-r${REP:-0}"
    perfsim run --model digits-mlp --pp 4 --schedule 1f1b --micro-batch 64 --macro-batch 256 \
      --dataset-limit 512 --steps "${TSTEPS:-10}" --seed 0 --compress "$c" \
      --emulate-bandwidth "$bw" --out "$WORK/$name" --no-progress
    keep "$WORK/$name" "$HERE/throughput/$name"
  done
done
