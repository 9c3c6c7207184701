"""Print the kernels eager PyTorch launches for a transformer block, as torch.profiler counts
them on the CPU, beside perfsim's eager list (:mod:`perfsim.models.eager`) and Megatron's fused
one (:func:`perfsim.models.ops.block_ops`): memory-bound kernels and the bytes they move, forward
and backward (docs/model.md, "Eager PyTorch"); a bf16 GPT block's profiled bytes are 8 per token
short of the GPU's (the CPU keeps LayerNorm's mean and rstd in bf16, CUDA in fp32).

    python scripts/eager_kernels.py            # b 2, s 16, hidden 64, 4 heads (2 kv), ffn 96
    python scripts/eager_kernels.py --steps traces/gpu/h100-steps-2026-11-26.csv --gpu h100-sxm5-80gb

``--steps``: the measured whole steps of ``scripts/gpu_step_bench.py`` (its Megatron-attention
and ``megatron-flash`` rows: execute mode's GPT block with Megatron's dropouts, pure bf16) against
``perfsim predict`` with each ``--kernels``, signed errors.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "models"))


def main(argv=None) -> int:
    from eager_profile import gpt_kernels, llama_kernels
    from perfsim.models.eager import eager_block_ops
    from perfsim.models.ops import block_ops
    from perfsim.models.transformer import arch_spec

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=96)
    ap.add_argument("--steps", help="a gpu_step_bench.py CSV: predict its rows with each --kernels")
    ap.add_argument("--gpu", default="h100-sxm5-80gb", help="the GPU preset of --steps")
    a = ap.parse_args(argv)
    if a.steps:
        return steps(a.steps, a.gpu)
    b, s, h = a.batch, a.seq, a.hidden
    print("| block | precision | way | fwd kernels | fwd bytes | bwd kernels | bwd bytes |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for mode, bpv, autocast, prec in (("autocast", 2, True, "bf16 autocast"), ("fp32", 4, True, "fp32"),
                                      ("bf16", 2, False, "bf16 weights (eager-pure)")):
        cases = [("Llama (GQA, SDPA)", arch_spec("llama", "p", n_layer=1, hidden=h, heads=a.heads, kv_heads=a.kv_heads,
                                                 seq_len=s, vocab=64, ffn=a.ffn),
                  lambda: llama_kernels(b, s, h, a.heads, a.kv_heads, a.ffn, mode)),
                 ("GPT (SDPA)", arch_spec("gpt", "p", n_layer=1, hidden=h, heads=a.heads, seq_len=s, vocab=64),
                  lambda: gpt_kernels(b, s, h, a.heads, mode, True))]
        for name, spec, prof in cases:
            k = prof()
            rows = {"torch.profiler": [(len(m), sum(x.bytes for x in m)) for m in
                                       ([x for x in k[p] if not x.gemm] for p in ("fwd", "bwd"))]}
            for way, ops in (("perfsim eager", eager_block_ops(spec, b, 1, False, bpv, "flash", autocast)),
                             ("perfsim fused", block_ops(spec, b, 1, False, bpv, "flash"))):
                f = [o for o in ops if o.bytes and not o.m and not o.flash]
                bw = [(o.bwd_bytes if o.bwd_bytes is not None else 2 * o.bytes) for o in ops
                      if not o.m and not o.flash and (o.bwd_bytes if o.bwd_bytes is not None else o.bytes)]
                rows[way] = [(len(f), sum(o.bytes for o in f)), (len(bw), sum(bw))]
            for way, ((fk, fb), (bk, bb)) in rows.items():
                print(f"| {name} | {prec} | {way} | {fk} | {fb:,.0f} | {bk} | {bb:,.0f} |")
    return 0


def steps(path: str, gpu: str) -> int:
    import csv

    import perfsim

    ways = ("fused", "eager", "eager-pure")
    print("| attention | hidden | micro-batch | measured | " + " | ".join(f"--kernels {w}" for w in ways) + " |")
    print("| --- | ---: | ---: | ---: | " + " | ".join("---:" for _ in ways) + " |")
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if r["attention"] not in ("megatron", "megatron-flash"):
                continue  # the "flash"/"math" rows ran execute mode's block without dropouts
            h, mb, measured = int(r["hidden"]), int(r["micro_batch"]), float(r["step_s"])
            cells = []
            for way in ways:
                t = perfsim.predict(model=f"gpt:layers={r['layers']},hidden={h},heads={r['heads']},seq={r['seq']},"
                                          f"vocab={r['vocab']}", gpu=gpu, tp=1, pp=1, dp=1, micro_batch=mb,
                                    global_batch=mb, precision="bf16", recompute="none", kernels=way,
                                    attention="flash" if r["attention"] == "megatron-flash" else "megatron",
                                    allow_oom=True).summary["iteration_s"]
                cells.append(f"{t * 1e3:.1f} ms ({100 * (t / measured - 1):+.1f} %)")
            name = "flash" if r["attention"] == "megatron-flash" else "Megatron"
            print(f"| {name} | {h} | {mb} | {measured * 1e3:.1f} ms | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
