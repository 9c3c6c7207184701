"""Check (not fit) the modelled GPU codec cost against the codec times measured on GPUs.

    python scripts/codec_check.py [--profile traces/gpu-h200.json] [--kernels traces/gpu/h100-kernels-2026-11-27.csv]

:mod:`perfsim.engine.codec_cost` prices a compressor's encode and decode on a GPU that no
profile timed: its kernels (``Compressor.codec_traffic``) each at least the curve's host time
per operator (``kernel_s``), else their bytes at the GPU's achieved memory bandwidth. Two
stored measurements test it, neither used to set it:

* ``--profile``: a ``perfsim calibrate`` run on a GPU (its ``encode`` / ``decode`` records:
  the whole ``compress`` / ``decompress`` call, host included, tensors ``(rows, n / rows)``
  of 4 KB to 1 MB): measured / modelled per compressor family, the median over specs and
  sizes, modelled on the profile's own GPU preset;
* ``--kernels``: a ``benchmarks/bench_kernels.py`` run (the Triton kernels alone,
  ``triton.testing.do_bench`` medians with the L2 flushed, 16 MB to 1 GB): each kernel against
  the modelled passes of the compressor that runs it (``encode`` / ``decode`` BITS: DirectQ at
  1024 values a bucket, ``aqsgd`` BITS: AQ-SGD's sender step, 1 bit: 1-bit Adam's), with and
  without the host floor (do_bench times the GPU only).

Prints one table per source; exit 2 on an unreadable input (one line).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from kernel_csv import CsvError, device_of, read_rows  # noqa: E402

from perfsim.compression import make_compressor  # noqa: E402
from perfsim.engine.codec_cost import ModelledCodecs  # noqa: E402
from perfsim.errors import ConfigError  # noqa: E402
from perfsim.hardware import get_gpu, profile_gpu  # noqa: E402
from perfsim.profile import load_profile  # noqa: E402

BUCKET = 1024  # benchmarks/bench_kernels.py's values per scale


def profile_ratios(path: str) -> tuple[str, list[tuple[str, str, float, float, float]]]:
    """(GPU, rows of (family, op, median measured/modelled, its min, its max))."""
    prof = load_profile(path)
    gpu = profile_gpu(prof)
    if gpu is None:
        raise ConfigError(f"profile {path!r}: names no GPU preset")
    model = ModelledCodecs(gpu)
    by: dict[tuple[str, str], list[float]] = {}
    for r in prof.records:
        if r["op"] not in ("encode", "decode") or "shape" in r or r.get("time_s", 0) <= 0:
            continue
        rows = int(r.get("micro_batch") or 1)
        shape = (rows, int(r["size_bytes"]) // 4 // rows)
        side = 0 if r["op"] == "encode" else 1
        try:
            modelled = model.passes_time(make_compressor(r["name"]).codec_traffic(shape)[side])
        except ConfigError:
            continue
        if modelled > 0:
            by.setdefault((r["name"].split(":")[0], r["op"]), []).append(r["time_s"] / modelled)
    return gpu.name, [(f, op, statistics.median(v), min(v), max(v)) for (f, op), v in sorted(by.items())]


def kernel_ratios(path: str) -> tuple[str, list[tuple[str, int, float, float]]]:
    """(GPU, rows of (kernel label, size bytes, measured/modelled, measured/bandwidth term))."""
    rows = [r for r in read_rows(path) if r["way"] == "triton"]
    device = device_of(rows) or "NVIDIA H100 80GB HBM3"
    gpu = get_gpu("h100" if "H100" in device else "h200" if "H200" in device else device)
    model = ModelledCodecs(gpu)
    floorless = ModelledCodecs(gpu, host_overhead_s=0.0)
    acc: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for r in rows:
        kernel, bits, nbytes = r["kernel"], r["bits"], r["size_bytes"]
        n = nbytes // 4
        if kernel in ("encode", "decode"):
            spec, side = ("onebit" if bits == 1 else f"directq:{bits}"), 0 if kernel == "encode" else 1
        elif kernel == "aqsgd":
            spec, side = f"aqsgd:{bits}", 0
        else:
            continue
        shape = (n // BUCKET, BUCKET)
        kernels = make_compressor(spec).codec_traffic(shape)[side]
        if spec.startswith("aqsgd"):  # the sender's step alone (bench_kernels times aqsgd_step)
            kernels = kernels[-1:]
        t = float(r["time_s"])
        acc.setdefault((f"{kernel} {bits}-bit", nbytes), []).append(
            (t / model.passes_time(kernels), t / floorless.passes_time(kernels)))
    out = [(k, size, statistics.median(a for a, _ in v), statistics.median(b for _, b in v))
           for (k, size), v in sorted(acc.items(), key=lambda kv: (kv[0][0], kv[0][1]))]
    return gpu.name, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--profile", default=os.path.join(ROOT, "traces", "gpu-h200.json"))
    ap.add_argument("--kernels", default=os.path.join(ROOT, "traces", "gpu", "h100-kernels-2026-11-27.csv"))
    a = ap.parse_args(argv)
    try:
        gpu, rows = profile_ratios(a.profile)
        kgpu, krows = kernel_ratios(a.kernels)
    except (ConfigError, CsvError) as e:
        print(f"codec_check: error: {e}", file=sys.stderr)
        return 2
    print(f"{os.path.relpath(a.profile, ROOT)}: whole compress/decompress calls, 4 KB-1 MB, modelled on {gpu}")
    print(f"{'family':<28} {'op':<7} {'measured/modelled':>18} {'min':>6} {'max':>6}")
    for fam, op, med, lo, hi in rows:
        print(f"{fam:<28} {op:<7} {med:18.2f} {lo:6.2f} {hi:6.2f}")
    allr = [med for _, _, med, _, _ in rows]
    print(f"median over families: {statistics.median(allr):.2f}")
    print(f"\n{os.path.relpath(a.kernels, ROOT)}: Triton kernels alone, modelled on {kgpu}")
    print(f"{'kernel':<16} {'size':>8} {'measured/modelled':>18} {'without host floor':>19}")
    for k, size, r1, r2 in krows:
        print(f"{k:<16} {size / 1e6:7.0f}M {r1:18.2f} {r2:19.2f}")
    big = [r2 for _, size, _, r2 in krows if size >= 256e6]
    print(f"median from 256 MB, without host floor: {statistics.median(big):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
