#!/usr/bin/env bash
# Reproduce traces/cpu-2core.json and the validation tables in traces/validation/
# (issue 5; --overwrite: each grid measured again, replacing its table). Needs root (network namespaces + tc). About 15-20 minutes on an idle
# 2-core machine; run it when nothing else loads the machine, and say so when not.
#
#   bash traces/validation/run_validation.sh            # calibrate + validate
#   SKIP_CALIBRATE=1 bash traces/validation/run_validation.sh
#   PROFILE=traces/cpu-2core-xeon-idle.json OUT_ROOT=traces/validation/xeon MODELS=gpt2-tiny \
#       bash traces/validation/run_validation.sh    # another machine: its own profile and tables
#   DRIFT_BEFORE=1 ...                              # and a drift check right before the first grid
#   ROW_DRIFT=1 ...                                 # and one before every row (perfsim validate --row-drift)
set -euo pipefail
cd "$(dirname "$0")/../.."
PROFILE=${PROFILE:-traces/cpu-2core.json}
RATES=${RATES:-1Gbps,300Mbps,100Mbps}
STEPS=${STEPS:-20}
DIGITS_STEPS=${DIGITS_STEPS:-$STEPS}   # digits-mlp steps last 2-6 ms: more of them (docs/validation.md, session 22)
REPEATS=${REPEATS:-2}
MODELS=${MODELS:-digits-mlp gpt2-tiny}
CAL_MODELS=${CAL_MODELS:-digits-mlp,gpt2-tiny}   # the models calibrated (MODELS=gpt2-tiny: CAL_MODELS=gpt2-tiny)
OUT_ROOT=${OUT_ROOT:-traces/validation}

if [ -z "${SKIP_CALIBRATE:-}" ]; then
  # compute: per-layer and per-stage times at the runs' micro-batch, 1 thread (what
  # each of 2 ranks gets), timed in 2 processes at once (the two ranks compute at
  # the same time on the 2 cores: ~3 % slower than alone); codecs at 1 thread; comm
  # over loopback and over each emulated rate (token-bucket fit: rate, burst).
  # time_s = median of the repeats (what a run's steps see); on a loaded machine use
  # STATISTIC=min (interference only adds time). validate keeps the fastest of 2 runs.
  # whole stages are timed as a pipeline rank runs them: the 1F1B rows of 4 micro-batches
  # (macro-batch 32 / micro-batch 8), execute mode's stage modules, optimizer step per step.
  # messages up to 64 KB: 60 repeats (bimodal; their mean is the per-message fixed cost).
  # --tp 2: one TP rank's compute as execute mode runs it (DTensor), for the TP grids below;
  # reduce_scatter,allgather_tensor: the collectives sequence parallelism issues, per link
  # (their default emulated ops), priced relative to the allreduce (perfsim.collectives.measured).
  # --stage-schedule: each schedule the grids below run gets an in-situ run of its own
  # (interleaved 1F1B's chunks, ZB-H1's split backward).
  perfsim calibrate --model "$CAL_MODELS" --micro-batch 8 --stages 1,2 --stage-microbatches 4 \
      --stage-schedule 1f1b,interleaved-1f1b,zb-h1 \
      --small-repeats 60 --tp 2 \
      --statistic "${STATISTIC:-median}" --concurrent \
      --comm p2p,allreduce,allgather,alltoall,reduce_scatter,allgather_tensor,messenger,late,framing,interference \
      --emulate-bandwidth "$RATES" \
      --overwrite --output "$PROFILE"    # refreshes the profile in place (a file there is refused otherwise)
fi
if [ -n "${DRIFT_BEFORE:-}" ]; then
  # the machine's speed right before the first grid, as that grid's own drift check times it after
  # its runs (docs/validation.md, "The CPU band priced with each grid's own drift check")
  mkdir -p "$OUT_ROOT"
  python3 -c "import sys; from perfsim.calibrate.compare import comparison_text, drift_check; \
from perfsim.profile import load_profile; \
print('drift check before the first grid: ' + comparison_text(drift_check(load_profile(sys.argv[1]), \
sys.argv[2], 8, sys.argv[3], pp=2, schedule='1f1b'), sys.argv[1]))" \
      "$PROFILE" "${MODELS%% *}" "$OUT_ROOT/drift-check-before.json"
fi

for MODEL in $MODELS; do
  MODEL_STEPS=$STEPS; [ "$MODEL" = digits-mlp ] && MODEL_STEPS=$DIGITS_STEPS
  perfsim validate --overwrite ${ROW_DRIFT:+--row-drift} --model "$MODEL" --pp 2 --dp 1 --compress fp32,directq:fw4bw8,aqsgd:fw3bw6 \
      --emulate-bandwidth "$RATES" --profile "$PROFILE" --steps "$MODEL_STEPS" --repeats "$REPEATS" \
      --out "$OUT_ROOT/$MODEL-pp2"
  perfsim validate --overwrite ${ROW_DRIFT:+--row-drift} --model "$MODEL" --pp 1 --dp 2 --grad-compress none,qsgd-maxnorm:4 \
      --emulate-bandwidth "$RATES" --profile "$PROFILE" --steps "$MODEL_STEPS" --repeats "$REPEATS" \
      --out "$OUT_ROOT/$MODEL-dp2"
done
# the GPipe schedule on the same pipeline (gpt2-tiny): the other schedule the engine replays
perfsim validate --overwrite ${ROW_DRIFT:+--row-drift} --model gpt2-tiny --pp 2 --dp 1 --schedule gpipe --compress fp32,directq:fw4bw8,aqsgd:fw3bw6 \
    --emulate-bandwidth "$RATES" --profile "$PROFILE" --steps "$STEPS" --repeats "$REPEATS" \
    --out "$OUT_ROOT/gpt2-tiny-pp2-gpipe"
# BAND_ONLY=1: stop here -- the five grids above are the CPU profile band's rows (scripts/error_bands.py cpu_grids)
[ -n "${BAND_ONLY:-}" ] && exit 0
# interleaved 1F1B (2 chunks per rank) and ZB-H1 beside 1F1B, one rate (issue 20)
perfsim validate --overwrite ${ROW_DRIFT:+--row-drift} --model gpt2-tiny --pp 2 --dp 1 --schedule 1f1b,interleaved-1f1b,zb-h1 \
    --compress fp32,aqsgd:fw3bw6 --emulate-bandwidth 300Mbps --profile "$PROFILE" --steps "$STEPS" \
    --repeats "$REPEATS" --out "$OUT_ROOT/gpt2-tiny-pp2-schedules"
# a tied LM head kept equal Megatron's way (the embedding-gradient all-reduce between the stages)
perfsim validate --overwrite ${ROW_DRIFT:+--row-drift} --model gpt2-tiny --pp 2 --dp 1 --tied-embedding sync --compress fp32,aqsgd:fw3bw6 \
    --emulate-bandwidth "$RATES" --profile "$PROFILE" --steps "$STEPS" --repeats "$REPEATS" \
    --out "$OUT_ROOT/gpt2-tiny-pp2-tied"
# tensor parallelism (execute mode: torch.distributed.tensor.parallel on gloo), Megatron layout,
# with and without sequence parallelism (TP rows are predicted once the simulator has tp)
perfsim validate --overwrite ${ROW_DRIFT:+--row-drift} --model gpt2-tiny --pp 1 --dp 1 --tp 2 \
    --emulate-bandwidth "${TP_RATES:-1Gbps,100Mbps}" --profile "$PROFILE" --steps "$STEPS" --repeats "$REPEATS" \
    --out "$OUT_ROOT/gpt2-tiny-tp2"
perfsim validate --overwrite ${ROW_DRIFT:+--row-drift} --model gpt2-tiny --pp 1 --dp 1 --tp 2 --sequence-parallel \
    --emulate-bandwidth "${TP_RATES:-1Gbps,100Mbps}" --profile "$PROFILE" --steps "$STEPS" --repeats "$REPEATS" \
    --out "$OUT_ROOT/gpt2-tiny-tp2-sp"
