"""Does a GPU keep its GEMM rate under sustained load? (docs/validation.md, "Transformer Engine's fp8
quantisation kernels priced" and "Table 1 after session 19": the open multi-node rows are too fast in
proportion to compute, and short GEMM benchmarks -- what the curves were fitted on -- may run at a
boost clock that a training step, GEMMs back to back for minutes, does not hold under the board's
power limit.)

Runs one GEMM shape back to back for ``--seconds`` per precision, timing each window of
``--window`` seconds with CUDA events, while ``nvidia-smi`` samples the SM clock and the power draw
every 100 ms. Prints and writes (``--csv``) one row per window, and per precision and shape: the
first window's rate, the steady rate (median of the last half of the windows), their ratio, and the
clock and power over the steady half. Needs a CUDA GPU (fp8 on Hopper only: ``torch._scaled_mm``).

    python scripts/gpu_sustained_gemm.py --seconds 60 --csv $OUT/sustained.csv

Shapes (m, n, k): Megatron-LM Table 1's 175B-class layer at TP 8 (m = 2048 tokens, hidden 12288:
QKV 2048 x 4608 x 12288) and NeMo's GPT3-5B MLP at micro-batch 4 (8192 x 16384 x 4096).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import time

SHAPES = ((2048, 4608, 12288), (8192, 16384, 4096))


def summarize(windows: list[dict]) -> dict:
    """First-window and steady (median of the last half) TFLOP/s of one precision and shape, their
    ratio, and the median SM clock (MHz) and power (W) over the steady half's windows (None where
    nothing was sampled). ``windows``: dicts with ``tflops`` and optional ``clock_mhz``, ``power_w``,
    in time order."""
    if not windows:
        raise ValueError("no windows")
    steady = windows[len(windows) // 2:]
    rate = statistics.median(w["tflops"] for w in steady)

    def med(key):
        xs = [w[key] for w in steady if w.get(key) is not None]
        return statistics.median(xs) if xs else None
    return {"first_tflops": windows[0]["tflops"], "steady_tflops": rate,
            "steady_over_first": rate / windows[0]["tflops"], "steady_clock_mhz": med("clock_mhz"),
            "steady_power_w": med("power_w"), "windows": len(windows)}


class Sampler:
    """``nvidia-smi`` sampling SM clock and power every 100 ms in the background."""

    def __init__(self):
        self.proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw", "--format=csv,noheader,nounits",
             "-lms", "100"], stdout=subprocess.PIPE, text=True, bufsize=1)
        self.samples: list[tuple[float, float, float]] = []

    def drain(self) -> None:
        """Read every sample waiting in the pipe, without blocking."""
        import select
        while select.select([self.proc.stdout], [], [], 0)[0]:
            line = self.proc.stdout.readline()
            if not line:
                return
            parts = [x.strip() for x in line.split(",")]
            try:
                self.samples.append((time.time(), float(parts[1]), float(parts[2])))
            except (IndexError, ValueError):
                pass

    def between(self, t0: float, t1: float) -> tuple[float | None, float | None]:
        xs = [(c, p) for t, c, p in self.samples if t0 <= t < t1]
        if not xs:
            return None, None
        return statistics.median(c for c, _ in xs), statistics.median(p for _, p in xs)

    def close(self) -> None:
        self.proc.terminate()


def run(precision: str, shape: tuple[int, int, int], seconds: float, window: float, sampler) -> list[dict]:
    import torch
    m, n, k = shape
    dev = "cuda"
    if precision == "fp8":
        a = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=dev)

        def gemm():
            return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    else:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
        a, b = torch.randn(m, k, device=dev, dtype=dtype), torch.randn(k, n, device=dev, dtype=dtype)

        def gemm():
            return a @ b
    for _ in range(10):
        gemm()
    torch.cuda.synchronize()
    out, t_start = [], time.time()
    while time.time() - t_start < seconds:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.time()
        start.record()
        iters = 0
        while time.time() - t0 < window:
            for _ in range(20):
                gemm()
            iters += 20
            if sampler is not None:
                sampler.drain()
        end.record()
        end.synchronize()
        t1 = time.time()
        if sampler is not None:
            sampler.drain()
        gpu_s = start.elapsed_time(end) / 1e3
        clock, power = sampler.between(t0, t1) if sampler is not None else (None, None)
        out.append({"precision": precision, "m": m, "n": n, "k": k, "t_s": round(t0 - t_start, 2),
                    "tflops": 2.0 * m * n * k * iters / gpu_s / 1e12, "clock_mhz": clock, "power_w": power})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--seconds", type=float, default=60.0, help="per precision and shape (default 60)")
    ap.add_argument("--window", type=float, default=1.0, help="seconds per timed window (default 1)")
    ap.add_argument("--precisions", default="bf16,fp8", help="bf16, fp16, fp8 (Hopper), comma-separated")
    ap.add_argument("--csv", help="write every window here")
    args = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("gpu_sustained_gemm: no CUDA device", file=sys.stderr)
        return 2
    try:
        sampler = Sampler()
    except OSError:
        sampler = None
        print("gpu_sustained_gemm: nvidia-smi not found; rates only", file=sys.stderr)
    rows = []
    try:
        for precision in args.precisions.split(","):
            for shape in SHAPES:
                try:
                    w = run(precision, shape, args.seconds, args.window, sampler)
                except (RuntimeError, TypeError) as exc:  # fp8 off Hopper, an old torch
                    print(f"{precision} {shape}: skipped ({str(exc).splitlines()[0]})")
                    continue
                rows += w
                s = summarize(w)
                print(f"{precision} {shape}: first {s['first_tflops']:.0f} TFLOP/s, steady {s['steady_tflops']:.0f} "
                      f"({s['steady_over_first']:.3f}x), clock {s['steady_clock_mhz']} MHz, "
                      f"power {s['steady_power_w']} W, {s['windows']} windows", flush=True)
    finally:
        if sampler is not None:
            sampler.close()
    if args.csv and rows:
        with open(args.csv, "w", newline="") as fh:
            wr = csv.DictWriter(fh, fieldnames=list(rows[0]))
            wr.writeheader()
            wr.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
