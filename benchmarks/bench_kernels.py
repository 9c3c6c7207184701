"""Quantize/pack kernels against the memory-bandwidth limit of the device.

    python benchmarks/bench_kernels.py [--device cuda|cpu] [--sizes 64KB,16MB,1GB] [--csv out.csv]
                                       [--ways triton,triton-2pass,torch] [--repeat 3]

For each fp32 input size it measures the device's copy bandwidth (``dst.copy_(src)``:
bytes read + written / time) and, for every kernel, the time, the bytes it must move
at least (input read + payload written, and AQ-SGD's buffer read + written) and that
traffic as a share of the copy bandwidth (``% copy``): 100 % means the kernel moves
its unavoidable bytes as fast as a copy moves bytes. Kernels:

* ``encode b`` -- bucketed quantize + pack (b = 2, 3, 4, 8; bucket 1024) and the 1-bit
  sign pack with error feedback (``encode 1``: 1-bit Adam's compressor);
* ``decode b`` -- unpack + dequantize (1-bit: unpack signs times the scale);
* ``aqsgd b`` -- the fused AQ-SGD sender step (delta, quantize, pack, buffer update).

* ``pack-lanes b`` / ``unpack-lanes b`` -- the lane-packed all-reduce payload of QSGD-MaxNorm
  (:mod:`perfsim.kernels.lanes`, 4-bit codes over 2 workers: 12 lanes of 5 bits per int64
  word); uint8 codes read and words written, words read and int64 lane values written.

Each runs three ways: ``triton`` (the public entry: single-pass kernel where the bucket
fits, :mod:`perfsim.kernels.fused`), ``triton-2pass`` (scales reduced first, then one
rounding kernel) and ``torch`` (the plain-torch reference: the equivalent sequence of
torch ops on the same device); ``--ways`` picks some. The ``triton`` way calls only the
public entries, so this script also times older trees of the package (``scripts/kernel_bisect.py``).
On CUDA times are ``triton.testing.do_bench`` medians (L2 flushed before each call; the
encoders' finiteness check is deferred to a later synchronisation, :mod:`perfsim.kernels.finite`,
so the timed call has none); on the CPU, the median of a few wall-clock calls (the
references only: Triton needs a GPU outside the interpreter). Every row carries the device
name and the UTC date: ``scripts/kernel_regress.py`` compares two such CSVs and
``scripts/kernel_table.py`` writes the docs' table from one.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

BUCKET = 1024
SIZES = "64KB,256KB,1MB,4MB,16MB,64MB,256MB,1GB"
QUANT = (2, 3, 4, 8)
WAYS = ("triton", "triton-2pass", "torch")
LANES = (4, 2)  # 4-bit codes summed over 2 workers


def bench(fn, device: str) -> float:
    """Median seconds of one call."""
    if device == "cuda":
        from triton.testing import do_bench

        return do_bench(fn, warmup=10, rep=40, return_mode="median") / 1e3
    fn()
    out = []
    for _ in range(5):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def kernels(n: int, device: str, ways=WAYS):
    """(kernel, way, bits, callable, minimum bytes moved) for an input of n fp32 values.

    The package is imported here, not at the top, so that a caller may point ``perfsim``
    at another tree first (scripts/kernel_bisect.py); only the public entries and the
    references are used for the ``triton`` and ``torch`` ways."""
    from perfsim.kernels import quant, signpack
    from perfsim.kernels.aqsgd_step import aqsgd_step, aqsgd_step_ref
    from perfsim.kernels.packing import packed_nbytes

    x = torch.randn(n, device=device)
    scale_bytes = 4 * -(-n // BUCKET)
    gpu = device == "cuda"
    tri, two, ref = gpu and "triton" in ways, gpu and "triton-2pass" in ways, "torch" in ways
    for b in QUANT:
        payload = packed_nbytes(n, b) + scale_bytes
        p, s = quant.quantize_pack_ref(x, b, bucket=BUCKET)
        m = torch.zeros_like(x)
        if tri:
            yield "encode", "triton", b, lambda b=b: quant.quantize_pack(x, b, bucket=BUCKET), 4 * n + payload
            yield "decode", "triton", b, (lambda b=b, p=p, s=s: quant.unpack_dequantize(
                p, s, b, n, bucket=BUCKET)), 4 * n + payload
            yield "aqsgd", "triton", b, (lambda b=b, m=m: aqsgd_step(x, m, b, bucket=BUCKET)), 12 * n + payload
        if two:
            from perfsim.kernels.aqsgd_step import _aqsgd_step_triton

            yield "encode", "triton-2pass", b, (lambda b=b: quant._quantize_pack_triton(
                x, b, bucket=BUCKET, fused=False)), 4 * n + payload
            yield "aqsgd", "triton-2pass", b, (lambda b=b, m=m: _aqsgd_step_triton(
                x, m, b, bucket=BUCKET, fused=False)), 12 * n + payload
        if ref:
            yield "encode", "torch", b, lambda b=b: quant.quantize_pack_ref(x, b, bucket=BUCKET), 4 * n + payload
            yield "decode", "torch", b, (lambda b=b, p=p, s=s: quant.unpack_dequantize_ref(
                p, s, b, n, bucket=BUCKET)), 4 * n + payload
            yield "aqsgd", "torch", b, (lambda b=b, m=m: aqsgd_step_ref(x, m, b, bucket=BUCKET)), 12 * n + payload
    err = torch.zeros_like(x)
    packed = signpack.sign_pack_ref(x)
    ef_bytes = 12 * n + packed_nbytes(n, 1)  # x, e read; e written; signs written
    if tri:
        yield "encode", "triton", 1, lambda: signpack.ef_sign_compress(x, err), ef_bytes
        yield "decode", "triton", 1, lambda: signpack.sign_unpack(packed, n, 0.5), 4 * n + packed.numel()
    if ref:
        yield "encode", "torch", 1, lambda: signpack.ef_sign_compress_ref(x, err), ef_bytes
        yield "decode", "torch", 1, lambda: signpack.sign_unpack_ref(packed, n, 0.5), 4 * n + packed.numel()
    try:
        from perfsim.kernels import lanes
    except ImportError:  # trees before the lane-packed all-reduce
        return
    lb, world = LANES
    codes = torch.randint(0, 1 << lb, (n,), dtype=torch.uint8, device=device)
    words = lanes.pack_lanes_ref(codes, lb, world)
    pack_bytes, unpack_bytes = n + 8 * words.numel(), 8 * words.numel() + 8 * n
    if tri:
        yield "pack-lanes", "triton", lb, lambda: lanes.pack_lanes(codes, lb, world), pack_bytes
        yield "unpack-lanes", "triton", lb, lambda: lanes.unpack_lanes(words, n, lb, world), unpack_bytes
    if ref:
        yield "pack-lanes", "torch", lb, lambda: lanes.pack_lanes_ref(codes, lb, world), pack_bytes
        yield "unpack-lanes", "torch", lb, lambda: lanes.unpack_lanes_ref(words, n, lb, world), unpack_bytes


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else "cpu"


def run(sizes: str, device: str, ways=WAYS, echo=print, repeat: int = 1) -> list[dict]:
    """Every row of the benchmark (the copy baseline of each size first); with ``repeat`` > 1
    every size is measured that many times over (rows carry their ``pass``; readers take the
    median per kernel: one starved or disturbed pass then moves nothing)."""
    from perfsim.units import parse_size

    rows = []
    name, day = device_name(device), datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    for text, npass in [(t, p) for t in sizes.split(",") for p in range(1, repeat + 1)]:
        n = parse_size(text) // 4
        src = torch.randn(n, device=device)
        dst = torch.empty_like(src)
        t_copy = bench(lambda: dst.copy_(src), device)
        copy_bw = 8 * n / t_copy
        del src, dst
        echo(f"{text:>8} {'copy':>12} {'':>4} {'torch':>12} {t_copy * 1e3:9.3f} {copy_bw / 1e9:7.0f} {100.0:7.1f}")
        for kernel, way, bits, fn, nbytes in kernels(n, device, ways):
            t = bench(fn, device)
            row = dict(size=text, size_bytes=4 * n, kernel=kernel, bits=bits, way=way, time_s=t,
                       moved_bytes=nbytes, gbps=nbytes / t / 1e9, copy_gbps=copy_bw / 1e9,
                       pct_copy=100 * nbytes / t / copy_bw, device=name, date=day, **{"pass": npass})
            rows.append(row)
            echo(f"{text:>8} {kernel:>12} {bits:>4} {way:>12} {t * 1e3:9.3f} {row['gbps']:7.0f} "
                 f"{row['pct_copy']:7.1f}")
        if device == "cuda":
            try:
                from perfsim.kernels.finite import check_deferred
            except ImportError:  # an older tree (scripts/kernel_bisect.py): checks on the host
                pass
            else:
                check_deferred()  # the benchmark's own encodes were all finite
            torch.cuda.empty_cache()
    return rows


def write_csv(path: str, rows: list[dict]) -> None:
    """Write ``rows`` atomically (a temporary file renamed over ``path``)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sizes", default=SIZES, help=f"fp32 input sizes (default {SIZES})")
    ap.add_argument("--ways", default=",".join(WAYS), help=f"which ways to time (default {','.join(WAYS)})")
    ap.add_argument("--csv", default=None, help="also write the rows to this CSV file")
    ap.add_argument("--repeat", type=int, default=1,
                    help="measure every size this many times (the CSV keeps each pass; default 1)")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        print(f"bench_kernels: --repeat {args.repeat}: must be >= 1", file=sys.stderr)
        return 2
    ways = tuple(w for w in args.ways.split(",") if w)
    bad = [w for w in ways if w not in WAYS]
    if bad:
        print(f"bench_kernels: --ways {bad[0]!r}: choose from {', '.join(WAYS)}", file=sys.stderr)
        return 2
    if args.device == "cuda":
        print(f"# {torch.cuda.get_device_name()}  torch {torch.__version__}")
    print(f"{'size':>8} {'kernel':>12} {'bits':>4} {'way':>12} {'ms':>9} {'GB/s':>7} {'% copy':>7}")
    rows = run(args.sizes, args.device, ways, repeat=args.repeat)
    if args.csv and rows:
        write_csv(args.csv, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
