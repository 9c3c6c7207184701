"""Sweep the launch shapes of the single-pass encoder and the decoder on a GPU.

    python benchmarks/tune_kernels.py [--sizes 16MB,256MB]

Prints the do_bench median of ``fused_quantize_pack`` (kernel only, no NaN check) for
each ``(elements per program, warps)`` and of ``_unpack_dequantize_triton`` for each
``block``, 4-bit codes, bucket 1024, beside the copy time of the same input.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from perfsim.kernels import fused, quant  # noqa: E402
from perfsim.kernels.aqsgd_step import _aqsgd_step_triton  # noqa: E402
from perfsim.units import parse_size  # noqa: E402


def ms(fn) -> float:
    return do_bench(fn, warmup=10, rep=40, return_mode="median")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="16MB,64MB,256MB")
    ap.add_argument("--bits", type=int, default=4)
    args = ap.parse_args()
    b = args.bits
    for text in args.sizes.split(","):
        n = parse_size(text) // 4
        x = torch.randn(n, device="cuda")
        y = torch.empty_like(x)
        t_copy = ms(lambda: y.copy_(x))
        print(f"{text}: copy {t_copy * 1e3:.1f} us")
        for elems in (1024, 2048, 4096, 8192, 16384):
            for warps in (2, 4, 8, 16):
                fused._PROGRAM_ELEMS, fused._NUM_WARPS = elems, warps
                t = ms(lambda: fused.fused_quantize_pack(x, b, bucket=1024))
                m = torch.zeros_like(x)
                t2 = ms(lambda: fused.fused_aqsgd_step(x, m, b, bucket=1024))
                print(f"  encode elems={elems:5d} warps={warps:2d}: {t * 1e3:7.1f} us "
                      f"({100 * (4 * n * (1 + b / 32)) / (t / t_copy * 8 * n):5.1f}% copy)   "
                      f"aqsgd {t2 * 1e3:7.1f} us ({100 * (12 * n) / (t2 / t_copy * 8 * n):5.1f}% copy)")
        fused._PROGRAM_ELEMS, fused._NUM_WARPS = 4096, None
        p, s = quant.quantize_pack_ref(x, b, bucket=1024)
        for block in (128, 256, 512, 1024, 2048, 4096):
            t = ms(lambda: quant._unpack_dequantize_triton(p, s, b, n, bucket=1024, block=block))
            print(f"  decode block={block:5d}: {t * 1e3:7.1f} us "
                  f"({100 * (4 * n * (1 + b / 32)) / (t / t_copy * 8 * n):5.1f}% copy)")
        t = ms(lambda: quant.quantize_pack(x, b, bucket=1024))
        print(f"  public quantize_pack (with the NaN check): {t * 1e3:.1f} us")
        m = torch.zeros_like(x)
        t = ms(lambda: _aqsgd_step_triton(x, m, b, bucket=1024))
        print(f"  public aqsgd step (with the NaN check): {t * 1e3:.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
