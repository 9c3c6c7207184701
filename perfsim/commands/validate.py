"""`perfsim validate`: the same configurations measured for real and predicted, compared.

    perfsim validate --model digits-mlp --pp 2 --compress fp32,directq:fw4bw8,aqsgd:fw3bw6 \\
        --emulate-bandwidth 1Gbps,300Mbps,100Mbps --profile traces/cpu-2core.json
    perfsim validate --model digits-mlp --pp 1 --dp 2 --grad-compress none,qsgd-maxnorm:4 ...
    perfsim validate --model gpt2-tiny --pp 1 --tp 1,2 --emulate-bandwidth 1Gbps,100Mbps ...

Prints per bandwidth and compressor the predicted and measured throughput and
iteration time with the error of each row and the MAPE; writes
OUT/validation.csv and OUT/validation.png (predicted vs measured). The work is
:func:`perfsim.analysis.validate_grid.validate` (``perfsim.validate``).
"""

from __future__ import annotations

import inspect

from perfsim import params
from perfsim.analysis.validate_grid import validate
from perfsim.commands import add_no_progress, add_out

HELP = "run configurations for real and in the simulator; compare throughput (MAPE) into CSV + plot"
EXAMPLES = """examples:
  perfsim validate --model digits-mlp --pp 2 --compress fp32,directq:fw4bw8,aqsgd:fw3bw6 \\
      --emulate-bandwidth 1Gbps,300Mbps,100Mbps --profile traces/cpu-2core.json
  perfsim validate --model gpt2-tiny --pp 1 --dp 2 --grad-compress none,qsgd-maxnorm:4 --profile traces/cpu-2core.json
"""


#: the job's flags validate takes (perfsim.params.PARAMS; defaults validate_grid.validate's),
#: and those of them that take a comma list (one grid row per value)
JOB = ("model", "pp", "dp", "tp", "sequence_parallel", "tied_embedding", "schedule", "zero", "virtual_stages",
       "micro_batch", "macro_batch", "compress", "grad_compress")
LISTS = ("tp", "schedule", "compress", "grad_compress")


def add_arguments(p) -> None:
    defaults = {k: v.default for k, v in inspect.signature(validate).parameters.items()}
    shown = {k: ",".join(map(str, v)) if isinstance(v, tuple) else v for k, v in defaults.items() if k in JOB}
    params.add_arguments(p, lists=LISTS, only=JOB, shown=shown, helps=params.RUN_HELPS)  # its rows run for real
    p.add_argument("--emulate-bandwidth", default="none",
                   help="comma list of emulated link rates (needs root); 'none' = loopback, no emulation")
    p.add_argument("--emulate-latency", default="0ms", help="one-way latency of the emulated links")
    p.add_argument("--profile", default=None, help="profile calibrated on this machine (perfsim calibrate)")
    p.add_argument("--link-model", default="profile", choices=("profile", "nominal"),
                   help="what the simulator is told about the link: the rate and per-message cost the "
                        "profile measured over that emulated link (default), or the nominal rate")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps per measured run (default 20)")
    p.add_argument("--dataset-limit", type=int, default=None,
                   help="samples per epoch of the measured runs (default 4 steps' worth, so AQ-SGD's "
                        "uncompressed first epoch ends early)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=1,
                   help="measured runs per row; the one that counts is chosen as the profile's calibration chose its repeats (min: the fastest; median: the middle one)")
    add_out(p, None, "output folder (default traces/validation/<model>-pp<P>-dp<D>)")
    p.add_argument("--reuse-measured", action="store_true",
                   help="re-predict against the measured results stored in OUT/runs (no new runs; "
                        "rows without a stored result are run)")
    p.add_argument("--overwrite", action="store_true",
                   help="measure every row again, replacing OUT/validation.csv (without it a re-run on the "
                        "same --out resumes: rows measured with the same run parameters and perfsim "
                        "version are kept; a table of another grid is refused)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.add_argument("--no-drift-check", action="store_true",
                   help="skip timing the model's layers again after the runs to compare with the profile "
                        "(a few seconds; tells whether the profile still describes this machine)")
    p.add_argument("--row-drift", action="store_true",
                   help="also time the model's layers before each row (a few seconds a row, into "
                        "OUT/row-drift/) and predict the row again at that speed: the error apart from "
                        "the machine's drift between rows")
    add_no_progress(p)


def run(args) -> int:
    from perfsim.analysis import validate as v  # lazy: perfsim --help does not load perfsim.analysis.validate

    job = {name: getattr(args, name) if name in LISTS else params.normalize(name, getattr(args, name), cli=True)
           for name in JOB if getattr(args, name) is not None}  # not given: validate's default
    df = validate(profile=args.profile, **job,
                  bandwidths=args.emulate_bandwidth, latency=args.emulate_latency, link_model=args.link_model,
                  steps=args.steps, dataset_limit=args.dataset_limit, seed=args.seed, repeats=args.repeats,
                  reuse_measured=args.reuse_measured, overwrite=args.overwrite, out=args.out, plot=not args.no_plot,
                  progress=not args.no_progress, drift_check=not args.no_drift_check, row_drift=args.row_drift)
    print(v.format_table(df))
    if df.attrs.get("drift"):
        print(df.attrs["drift"])
    drifted = df.attrs["summary"].get("drifted")
    if drifted:
        print(f"at each row's own compute speed (--row-drift, {drifted['rows']} rows): iteration MAPE "
              f"{drifted['mape_pct']:.1f} %, mean signed {drifted['mean_signed_pct']:+.1f} %; the machine's "
              f"compute moved {drifted['drift_min']:.2f}x-{drifted['drift_max']:.2f}x of the profile's")
    print(f"wrote {df.attrs['csv']}", end="")
    if df.attrs["png"]:
        print(f" and {df.attrs['png']}", end="")
    elif not args.no_plot:  # e.g. TP rows the simulator cannot predict yet
        print(" (no plot: no row was predicted)", end="")
    print()
    return 0
