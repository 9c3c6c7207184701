"""Sweep the launch shapes of the single-pass encoders and the decoder on a GPU.

    python benchmarks/tune_kernels.py [--sizes 16MB,256MB] [--bits 4] [--csv out.csv]

Prints (and writes) the do_bench median of ``fused_quantize_pack`` and ``fused_aqsgd_step``
(kernel only; the finiteness check is on the device, :mod:`perfsim.kernels.finite`) for each
fixed ``(elements per program, warps)`` -- ``fused.AUTOTUNE`` off -- then with the autotuned
shape (``fused.TUNE_SHAPES``), and of ``_unpack_dequantize_triton`` for each ``block``;
bucket 1024, beside the copy time of the same input. ``% copy`` as in bench_kernels.py. Last,
the public entries called 200 times back to back (no flush; wall clock per call): where that
exceeds the kernel's time the host, not the GPU, bounds them.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from perfsim.kernels import fused, quant  # noqa: E402
from perfsim.kernels.finite import check_deferred, device_flag  # noqa: E402
from perfsim.units import parse_size  # noqa: E402

ELEMS = (2048, 4096, 8192)
WARPS = (4, 8)
BLOCKS = (256, 512, 1024, 2048)


def ms(fn) -> float:
    return do_bench(fn, warmup=10, rep=40, return_mode="median")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--sizes", default="16MB,64MB,256MB")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--csv", default=None)
    args = ap.parse_args(argv)
    b = args.bits
    rows = []
    for text in args.sizes.split(","):
        n = parse_size(text) // 4
        x = torch.randn(n, device="cuda")
        y = torch.empty_like(x)
        m = torch.zeros_like(x)
        flag = device_flag(x.device)
        t_copy = ms(lambda: y.copy_(x))
        enc_bytes, aq_bytes = 4 * n * (1 + b / 32), 12 * n

        def add(kernel, shape, t, nbytes):
            pct = 100 * nbytes / (t / t_copy * 8 * n)
            rows.append(dict(size=text, kernel=kernel, shape=shape, time_us=t * 1e3, pct_copy=pct))
            print(f"{text:>6} {kernel:>7} {shape:>16}: {t * 1e3:8.1f} us ({pct:5.1f} % copy)", flush=True)

        print(f"{text}: copy {t_copy * 1e3:.1f} us", flush=True)
        for auto in (False, True):
            fused.AUTOTUNE = auto
            shapes = [(e, w) for e in ELEMS for w in WARPS] if not auto else [("auto", "")]
            for elems, warps in shapes:
                if not auto:
                    fused._PROGRAM_ELEMS, fused._NUM_WARPS = elems, warps
                shape = "autotuned" if auto else f"elems={elems} w={warps}"
                add("encode", shape, ms(lambda: fused.fused_quantize_pack(x, b, bucket=1024, flag=flag)), enc_bytes)
                add("aqsgd", shape, ms(lambda: fused.fused_aqsgd_step(x, m, b, bucket=1024, flag=flag)), aq_bytes)
        fused.AUTOTUNE, fused._PROGRAM_ELEMS, fused._NUM_WARPS = True, 4096, None
        p, s = quant.quantize_pack_ref(x, b, bucket=1024)
        for block in BLOCKS:
            add("decode", f"block={block}", ms(lambda: quant._unpack_dequantize_triton(
                p, s, b, n, bucket=1024, block=block)), enc_bytes)
        # back to back, no L2 flush: max(host time, GPU time) per call of the public entries
        from perfsim.kernels.aqsgd_step import aqsgd_step

        for kernel, fn, nbytes in (("encode", lambda: quant.quantize_pack(x, b, bucket=1024), enc_bytes),
                                   ("decode", lambda: quant.unpack_dequantize(p, s, b, n, bucket=1024), enc_bytes),
                                   ("aqsgd", lambda: aqsgd_step(x, m, b, bucket=1024), aq_bytes)):
            fn()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(200):
                fn()
            torch.cuda.synchronize()
            add(kernel, "public back-to-back", (time.perf_counter() - t0) / 200 * 1e3, nbytes)
        check_deferred()
        del x, y, m
        torch.cuda.empty_cache()
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
