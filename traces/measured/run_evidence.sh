#!/usr/bin/env bash
# Re-create the measured evidence of execute mode (perfsim run) on this machine.
#   convergence: gpt2-tiny, 4 pipeline stages, same seed and steps, FP32 vs DirectQ vs AQ-SGD
#   throughput:  gpt2-tiny, 4 stages, emulated 1Gbps / 300Mbps / 100Mbps links (netns + tc; root)
# Raw run folders go to $WORK (default /tmp/perfsim-evidence); the small CSV/JSON
# files are copied next to this script.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
WORK="${WORK:-/tmp/perfsim-evidence}"
what="${1:-all}"
keep() {  # keep(run_dir, dest_dir): copy the small outputs
  mkdir -p "$2"
  cp "$1"/summary.csv "$1"/stages.csv "$1"/microbatches.csv "$1"/links.csv "$1"/losses.csv "$1"/result.json "$2"/
}
if [ "$what" = all ] || [ "$what" = convergence ]; then
  STEPS="${STEPS:-256}"
  for c in fp32 directq:fw2bw4 aqsgd:fw2bw4 directq:fw3bw6 aqsgd:fw3bw6; do
    name="conv-${c//:/-}"
    perfsim run --model gpt2-tiny --pp 4 --schedule 1f1b --micro-batch 8 --macro-batch 32 \
      --dataset-limit 1024 --steps "$STEPS" --seed 0 --lr 1e-3 --compress "$c" \
      --out "$WORK/$name" --no-progress
    keep "$WORK/$name" "$HERE/convergence/$name"
  done
fi
if [ "$what" = all ] || [ "$what" = throughput ]; then
  for bw in 1Gbps 300Mbps 100Mbps; do
    for c in fp32 directq:fw2bw4 aqsgd:fw2bw4 directq:fw4bw8 aqsgd:fw4bw8; do
      name="tput-$bw-${c//:/-}"
      # 64 samples = 2 steps per epoch: AQ-SGD's uncompressed first epoch is over at step 2,
      # the summary then averages the compressed steps only
      perfsim run --model gpt2-tiny --pp 4 --schedule 1f1b --micro-batch 8 --macro-batch 32 \
        --dataset-limit 64 --steps "${TSTEPS:-10}" --seed 0 --compress "$c" \
        --emulate-bandwidth "$bw" --out "$WORK/$name" --no-progress
      keep "$WORK/$name" "$HERE/throughput/$name"
    done
  done
fi
