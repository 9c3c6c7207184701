#!/usr/bin/env bash
# Re-predict every validation grid against its stored measurements (no new runs):
# `perfsim validate --reuse-measured` reads runs/<row>/result.json when present,
# else the measured columns of the grid's validation.csv.
#   bash traces/validation/repredict.sh             # in place
#   OUT_ROOT=/tmp/before bash traces/validation/repredict.sh   # copies, leaves the tables
set -euo pipefail
cd "$(dirname "$0")/../.."
PROFILE=${PROFILE:-traces/cpu-2core.json}
RATES=1Gbps,300Mbps,100Mbps
OUT_ROOT=${OUT_ROOT:-traces/validation}
grid() {  # name, flags...
  local name=$1; shift
  if [ "$OUT_ROOT" != traces/validation ]; then
    mkdir -p "$OUT_ROOT/$name"; cp "traces/validation/$name/validation.csv" "$OUT_ROOT/$name/"
  fi
  perfsim validate "$@" --emulate-bandwidth "$RATES" --profile "$PROFILE" --steps 20 --repeats 2 \
      --out "$OUT_ROOT/$name" --reuse-measured --no-progress --no-plot | tail -1
}
for MODEL in gpt2-tiny digits-mlp; do
  grid "$MODEL-pp2" --model "$MODEL" --pp 2 --dp 1 --compress fp32,directq:fw4bw8,aqsgd:fw3bw6
  grid "$MODEL-dp2" --model "$MODEL" --pp 1 --dp 2 --grad-compress none,qsgd-maxnorm:4
done
grid gpt2-tiny-pp2-gpipe --model gpt2-tiny --pp 2 --dp 1 --schedule gpipe \
    --compress fp32,directq:fw4bw8,aqsgd:fw3bw6
