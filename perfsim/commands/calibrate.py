"""`perfsim calibrate`: measure this machine and write a profile for `perfsim predict`.

The flags are the keywords of :func:`perfsim.calibrate.calibration.calibrate`
(``perfsim.calibrate``), which measures and writes the profile.
"""

from __future__ import annotations

import sys
import time

from perfsim.calibrate.calibration import DEVICES, STAGE_TIMINGS, STATISTICS, calibrate, plan_calibration
from perfsim.commands import add_keywords, add_no_progress, add_out
from perfsim.outputs import is_stdio

HELP = "measure compute, encode/decode and communication costs of this machine into a profile"
EXAMPLES = """examples:
  perfsim calibrate --quick --output traces/mybox.json
  perfsim calibrate --model gpt2-tiny --micro-batch 1,4,8 --emulate-bandwidth 1Gbps,100Mbps --output traces/mybox.json
  perfsim calibrate --model gpt2-tiny --micro-batch 8 --codecs none --comm none --concurrent \
      --output /tmp/now.json --compare traces/mybox.json     # has this machine drifted?
"""

#: the help of each flag; flags, defaults and types are the keywords of plan_calibration
HELPS = {
    "model": "comma list of model presets to time (default {default})",
    "micro_batch": "comma list of micro-batch sizes (default {default})",
    "dtype": "comma list of compute dtypes (default {default})",
    "stages": "pipeline degrees whose whole stages are timed too (default {default}; '' for none)",
    "stage_microbatches": "micro-batches per step when timing whole stages (default {default}: the runs' "
                          "macro-batch 32 / micro-batch 8)",
    "stage_schedule": "comma list of schedules whose whole stages are timed, each in a run of its own "
                      "(default {default}; interleaved-1f1b chunks and zb-h1's split backward need "
                      "--stage-timing run)",
    "stage_timing": "how whole stages are timed: run (a short loopback perfsim run of --ranks processes, "
                    "the runs' own layout; docs/validation.md), harness (the stage modules driven by the "
                    "schedule in each process) or auto (default: run on a CPU, the harness on a GPU and with --quick)",
    "small_repeats": "repeats of comm messages up to 64 KB, or over an emulated link up to its token-bucket "
                     "depth (bimodal: their mean is the simulator's per-message fixed cost; default {default}, "
                     "--quick uses --repeats)",
    "codecs": "comma list of compressor specs to time, 'all' (default) or 'none'",
    "comm": "comma list of communication ops to time (messenger = execute mode's message "
            "path, late = its receive posted after the data arrived, framing = its host "
            "time per message, interference = compute alone vs under concurrent allreduces, "
            "reduce_scatter / allgather_tensor = the reduce_scatter_tensor / all_gather_into_tensor "
            "calls tensor parallelism issues, fsdp = FSDP2's own host time per fully_shard unit: "
            "hooks, unshard / reshard, CPU time of the training thread), or 'none'",
    "emulate_bandwidth": "also measure comm over emulated links of these rates (comma list, e.g. "
                         "1Gbps,100Mbps; needs root for network namespaces)",
    "emulate_latency": "one-way delay of the emulated links (default {default})",
    "emulate_ops": "comm ops measured over the emulated links (default {default})",
    "ranks": "ranks that will share this machine in the runs the profile is for: compute is timed "
             "with cores/ranks threads and comm with this many ranks (default {default})",
    "concurrent": "time compute and the compressors' data-parallel paths in --ranks processes at once "
                  "(contention between co-located ranks)",
    "device": "where to time compute and codecs (default {default}: cuda when visible)",
    "repeats": "timed repeats per point (default 15, quick 5)",
    "quick": "fewer sizes and repeats (the command prints its estimated duration first)",
    "statistic": "what time_s records: the median of the repeats (default) or their minimum "
                 "(the undisturbed cost on a machine shared with other jobs)",
    "efficiency": "also measure the compute model's efficiency curves (GEMM by shape, attention, "
                  "elementwise, norm, AdamW) in these dtypes: comma list of bfloat16, float16, "
                  "float32, tf32, 'all', or 'none' (default)",
    "tp": "also time one tensor-parallel rank's compute per micro-batch at these TP degrees (comma "
          "list, e.g. 2), by running execute mode (perfsim run --tp) for a few steps, with and "
          "without sequence parallelism; the simulator then uses it instead of splitting the "
          "single-rank times",
}


def add_arguments(p) -> None:
    add_keywords(p, plan_calibration, HELPS, choices={"device": DEVICES, "statistic": STATISTICS,
                                                      "stage_timing": STAGE_TIMINGS})
    add_out(p, "traces/calibrated.json", "profile file to write (- is stdout); a file there is refused "
                                          "unless --overwrite")
    p.add_argument("--overwrite", action="store_true", help="replace a file at --out (an earlier profile)")
    p.add_argument("--compare", metavar="PROFILE", help="then compare the measurements with this profile's "
                   "(median ratio per group: compute, codecs, communication): has the machine drifted?")
    add_no_progress(p)


def run(args) -> int:
    old = None
    if args.compare:  # read it first: a bad path fails before minutes of measuring
        from perfsim.profile import load_profile  # lazy: perfsim --help does not load perfsim.profile

        old = load_profile(args.compare)
    started = time.perf_counter()
    profile = calibrate(args.out, progress=not args.no_progress, overwrite=args.overwrite,
                        command=" ".join(["perfsim calibrate", *sys.argv[2:]]),
                        **{k: getattr(args, k) for k in HELPS})
    meta = profile.metadata
    n_fit = sum(1 for r in profile.records if r["op"].startswith("fit_"))
    notes = sys.stderr if is_stdio(args.out) else sys.stdout  # -o -: the profile alone on stdout
    print(f"wrote {'stdout' if is_stdio(args.out) else args.out}: {len(profile.records)} records ({n_fit} fits) "
          f"in {time.perf_counter() - started:.1f} s on {meta['device_name']} ({meta['cores']} cores)", file=notes)
    if old is not None:
        # lazy: perfsim --help does not load perfsim.calibrate.compare
        from perfsim.calibrate.compare import compare_profiles, comparison_text

        print(comparison_text(compare_profiles(profile, old), args.compare), file=notes)
    return 0
