"""Fit a GPU's efficiency curve to a profile's ``perfsim calibrate --efficiency`` records.

    python scripts/fit_gpu_curve.py traces/gpu-h200.json --gpu h200-sxm-141gb --precision bf16

Prints the fitted :class:`perfsim.hardware.Curve` (the device side; the host side is
the A100 fit's, :func:`perfsim.engine.curve_fit.fit_curve`) and, per operator class, the
mean absolute error of each measured record's time under (a) the curve fitted here and
(b) the curve perfsim uses for this GPU (``--against GPU``: that GPU preset's curve on this
GPU's datasheet peaks). That table is in docs/gpu.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys


def class_errors(profile, gpu, precision: str, curve, min_time_s: float) -> dict[str, tuple[int, float]]:
    """{operator class: (records, MAPE %)} of the curve's op times against the records."""
    from perfsim.engine import compute as C
    from perfsim.hardware import BYTES_PER_VALUE
    from perfsim.models.ops import Op

    bpv = BYTES_PER_VALUE[precision]
    dtype = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "tf32": "tf32"}[precision]
    out = {}
    for op in ("gemm", "misaligned gemm", "elementwise", "norm"):
        errs = []
        for r in profile.select(op.split()[-1]):
            if r.get("dtype") != dtype or r["time_s"] < min_time_s:
                continue
            if op.endswith("gemm") and C._named_misaligned(r["name"], bpv) != (op == "misaligned gemm"):
                continue
            if op.endswith("gemm"):
                kernel = Op("gemm", *C.gemm_dims(r["name"]))
            else:
                kernel = Op(op, bytes=r["size_bytes"])
            # the records are kernel times: no host floor
            t = C.op_time(kernel, gpu, precision, dataclasses.replace(curve, kernel_s=0.0), bpv)
            errs.append(abs(t - r["time_s"]) / r["time_s"])
        if errs:
            out[op] = (len(errs), 100 * statistics.fmean(errs))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("profile")
    ap.add_argument("--gpu", required=True, help="the GPU preset the profile was measured on")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--min-time", type=float, default=20e-6, help="leave out records shorter than this (s)")
    ap.add_argument("--against", help="compare with this GPU preset's curve (default: the GPU's own)")
    args = ap.parse_args(argv)
    from perfsim.engine.curve_fit import fit_curve
    from perfsim.hardware import A100_CURVE, curve_for, get_gpu
    from perfsim.profile import load_profile

    profile = load_profile(args.profile)
    gpu = get_gpu(args.gpu)
    before, said = curve_for(gpu)
    if args.against:
        other = get_gpu(args.against)
        before, said = other.curve, f"{other.name}'s curve on {gpu.name}'s peaks"
    fitted = fit_curve(profile, gpu, args.precision, A100_CURVE, f"fitted on {gpu.name}",
                         args.min_time)
    print(f"fitted on {args.profile} ({args.precision}): eff_max={fitted.eff_max} knee={fitted.knee} "
          f"mem_eff={fitted.mem_eff} misaligned_eff={fitted.misaligned_eff}")
    print(f"other curve: {said}")
    print("| operator class | records | MAPE, curve fitted here | MAPE, other curve |")
    print("| --- | ---: | ---: | ---: |")
    a = class_errors(profile, gpu, args.precision, fitted, args.min_time)
    b = class_errors(profile, gpu, args.precision, before, args.min_time)
    for op in a:
        print(f"| {op} | {a[op][0]} | {a[op][1]:.1f} % | {b[op][1]:.1f} % |")
    return 0


if __name__ == "__main__":
    from perfsim.errors import ConfigError

    try:
        sys.exit(main())
    except ConfigError as exc:  # bad input: one line, exit 2
        print(f"fit_gpu_curve: {exc}", file=sys.stderr)
        sys.exit(2)
