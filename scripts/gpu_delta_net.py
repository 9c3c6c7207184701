"""Are a Gated DeltaNet block's chunk kernels as fast as perfsim prices them? (docs/model.md, "Qwen3-Next:
Gated DeltaNet blocks": the chunked delta rule is priced from its kernels' FLOPs and bytes, the state
pass by the SMs its thread blocks fill; no kernel was timed.)

Times flash-linear-attention's ``chunk_gated_delta_rule`` (forward, and forward + backward) with CUDA
events at Qwen3-Next's shapes (``d_k = d_v = 128``, L2-normalised queries and keys) for several
(micro-batch, sequence, value heads per rank) and prints, per shape, the measured milliseconds beside
what perfsim's ops of the same kernels cost on the GPU's preset (``delta_chunk_*``,
``delta_solve_tril``, ``delta_state_store``, ``delta_decay``, ``delta_qk_l2norm``: the rule's own
kernels, not the projections), and the ratio measured / modelled. Needs a CUDA GPU and the
``fla-core`` and ``einops`` wheels (pure Python; carry them in ``.whl/``, docs/gpu.md).

    python scripts/gpu_delta_net.py --gpu h100 --csv $OUT/delta_net.csv
    python scripts/gpu_delta_net.py --gpu h100 --model-only     # perfsim's side alone, no GPU needed
"""

from __future__ import annotations

import argparse
import sys

#: (micro-batch, sequence, value heads on the rank): Qwen3-Next's 32 heads at TP 1, 2, 8, and longer sequences
SHAPES = ((1, 4096, 32), (1, 4096, 16), (1, 4096, 4), (2, 4096, 32), (1, 16384, 32), (1, 32768, 8))
#: perfsim's ops that stand for the rule's own kernels (perfsim.models.delta_net.GatedDeltaNet.ops)
RULE_OPS = ("delta_decay", "delta_qk_l2norm", "delta_qk_repeat", "delta_chunk_local", "delta_solve_tril",
            "delta_chunk_state", "delta_state_store", "delta_chunk_inter")


def modelled_ms(gpu_name: str, mb: int, seq: int, heads: int) -> tuple[float, float]:
    """(forward, forward + backward) ms perfsim gives the rule's kernels of one rank holding ``heads`` value
    heads (and half as many query/key heads, Qwen3-Next's ratio), bf16, on preset ``gpu_name``."""
    from perfsim.engine.compute import ops_fwd_bwd
    from perfsim.hardware import curve_for, get_gpu
    from perfsim.models.delta_net import GatedDeltaNet

    gpu = get_gpu(gpu_name)
    curve = curve_for(gpu)
    curve = curve[0] if isinstance(curve, tuple) else curve
    net = GatedDeltaNet(key_heads=max(1, heads // 2), value_heads=heads, key_dim=128, value_dim=128)
    ops = [op for op in net.ops(mb, seq, 2048, 1, 2) if op.name in RULE_OPS]
    fwd, bwd = ops_fwd_bwd(ops, "none", gpu, "bf16", curve)
    return fwd * 1e3, (fwd + bwd) * 1e3


def measured_ms(mb: int, seq: int, heads: int, reps: int) -> tuple[float, float]:
    """(forward, forward + backward) median ms of fla's ``chunk_gated_delta_rule`` on the CUDA device."""
    import torch
    import torch.nn.functional as F
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    dev, dt = "cuda", torch.bfloat16
    q, k = (torch.randn(mb, seq, heads, 128, device=dev, dtype=dt, requires_grad=True) for _ in range(2))
    v = torch.randn(mb, seq, heads, 128, device=dev, dtype=dt, requires_grad=True)
    g = F.logsigmoid(torch.randn(mb, seq, heads, device=dev, dtype=torch.float32)).requires_grad_()
    beta = torch.rand(mb, seq, heads, device=dev, dtype=torch.float32).requires_grad_()

    def forward():
        return chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)[0]

    def both():
        forward().float().sum().backward()

    out = []
    for fn in (forward, both):
        for _ in range(3):  # autotuning and warm-up
            fn()
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        out.append(sorted(times)[len(times) // 2])
    return out[0], out[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="h100", help="perfsim GPU preset the model prices on (default h100)")
    ap.add_argument("--reps", type=int, default=20, help="timed repetitions per shape (default 20)")
    ap.add_argument("--model-only", action="store_true", help="print perfsim's side only (no GPU)")
    ap.add_argument("--csv", help="also write the rows here")
    args = ap.parse_args(argv)
    rows = []
    print("mb   seq  heads  fwd meas / model ms  fwd+bwd meas / model ms  ratio fwd / fwd+bwd")
    for mb, seq, heads in SHAPES:
        mf, mt = modelled_ms(args.gpu, mb, seq, heads)
        row = dict(micro_batch=mb, seq=seq, value_heads=heads, model_fwd_ms=round(mf, 4), model_total_ms=round(mt, 4))
        if not args.model_only:
            f, t = measured_ms(mb, seq, heads, args.reps)
            row.update(meas_fwd_ms=round(f, 4), meas_total_ms=round(t, 4), ratio_fwd=round(f / mf, 3),
                       ratio_total=round(t / mt, 3))
        rows.append(row)
        meas = (f"{row['meas_fwd_ms']:8.3f}", f"{row['meas_total_ms']:8.3f}", f"{row['ratio_fwd']:.2f} / "
                f"{row['ratio_total']:.2f}") if not args.model_only else ("-", "-", "-")
        print(f"{mb:2d} {seq:5d} {heads:6d}  {meas[0]:>8} / {mf:8.3f}   {meas[1]:>8} / {mt:8.3f}   {meas[2]}")
    if args.csv:  # written whole or not at all
        from perfsim.outputs import records_csv, write_text

        write_text(args.csv, records_csv(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
