#!/usr/bin/env bash
# One time-boxed device pass over the Triton kernels' bandwidth (issue 36, docs/gpu.md).
#
#   bash scripts/gpu_kernels_session.sh [all|verify]      (run from this tree's root)
#
# Expects the trees to compare beside this one: ../c-<sha>/ (git archive <sha> perfsim kernels
# calibrate),
# and simpy's wheel in ../../.whl if any (none of these steps needs it). Writes into $OUT:
#   env.txt      device, driver, clocks, torch / Triton versions, each step's exit status and time
#   tests.txt    pytest -m gpu of the kernels, MaxNorm and lanes (byte-exactness on the device)
#   kernels.csv  benchmarks/bench_kernels.py of this tree: 16 MB, 64 MB, 256 MB, 1 GB, every way,
#                three passes (the checks take the median per kernel; one pass is not enough:
#                on 2026-11-27 single rows moved by up to 50 points between runs)
#   regress.txt  scripts/kernel_regress.py: kernels.csv against the last accepted traces/gpu CSV
#   bisect.csv   (all) scripts/kernel_bisect.py: the public entries of every tree, 16 MB and
#                256 MB, in ABBA order (1bac840 .. bbe8f3b, this tree, then back)
#   tune.csv     benchmarks/tune_kernels.py: launch shapes of the single-pass kernels and the
#                public entries' time back to back (16 MB; all: also 256 MB)
# Each step has its own time limit, so one that overruns loses only its own file.
set -u
MODE=${1:-all}
OUT=$(mkdir -p "${OUT:-gpu-out}" && cd "${OUT:-gpu-out}" && pwd)
. "$(dirname "$0")/gpu_steps.sh"
install_wheels ../../.whl
# perfsim.kernels and perfsim.calibrate live in kernels/ and calibrate/ (pyproject's package-dir)
ln -sfn ../kernels perfsim/kernels
ln -sfn ../calibrate perfsim/calibrate
gpu_env
step tests 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/kernels/test_kernels.py tests/compression/test_maxnorm.py \
    tests/kernels/test_lanes.py
cp "$OUT/logs/tests.log" "$OUT/tests.txt"
step bench 150 python3 benchmarks/bench_kernels.py --sizes 16MB,64MB,256MB,1GB --repeat 3 --csv "$OUT/kernels.csv"
step regress 20 python3 scripts/kernel_regress.py "$OUT/kernels.csv"
cp "$OUT/logs/regress.log" "$OUT/regress.txt"
if [ "$MODE" = all ]; then
    trees=()
    for sha in 1bac840 a2a8464 4d8bc25 fd002fe 58e201c 7084351 2097ef8 d148d4c bbe8f3b; do
        [ -d "../c-$sha" ] && trees+=(--tree "$sha=../c-$sha")
    done
    step bisect 200 python3 scripts/kernel_bisect.py "${trees[@]}" --tree cur=. --sizes 16MB,256MB \
        --ways triton --csv "$OUT/bisect.csv"
    # the check fails on main's kernels: bbe8f3b's rows against this tree's, same run
    step regress_main 20 python3 scripts/kernel_regress.py "$OUT/bisect.csv" --tree bbe8f3b \
        --baseline "$OUT/bisect.csv" --baseline-tree cur
    cat "$OUT/logs/regress_main.log" >> "$OUT/regress.txt"
    step tune 60 python3 benchmarks/tune_kernels.py --sizes 16MB,256MB --csv "$OUT/tune.csv"
else
    step tune 40 python3 benchmarks/tune_kernels.py --sizes 16MB --csv "$OUT/tune.csv"
fi
grep -h "copy\|encode    4\|aqsgd    4\|decode    4" "$OUT/logs/bench.log" | head -40
cat "$OUT/regress.txt"
cat "$OUT/env.txt"
cd "$OUT" && tar czf logs.tgz logs && rm -rf logs
