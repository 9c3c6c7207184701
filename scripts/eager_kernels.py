"""Print the kernels eager PyTorch launches for a transformer block, as torch.profiler counts
them on the CPU, beside perfsim's eager list (:mod:`perfsim.models.eager`) and Megatron's fused
one (:func:`perfsim.models.ops.block_ops`): memory-bound kernels and the bytes they move, forward
and backward (docs/model.md, "Eager PyTorch").

    python scripts/eager_kernels.py            # b 2, s 16, hidden 64, 4 heads (2 kv), ffn 96
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

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=96)
    a = ap.parse_args(argv)
    b, s, h = a.batch, a.seq, a.hidden
    print("| block | precision | way | fwd kernels | fwd bytes | bwd kernels | bwd bytes |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for mixed in (True, False):
        bpv, prec = (2, "bf16 autocast") if mixed else (4, "fp32")
        cases = [("Llama (GQA, SDPA)", arch_spec("llama", "p", n_layer=1, hidden=h, heads=a.heads, kv_heads=a.kv_heads,
                                                 seq_len=s, vocab=64, ffn=a.ffn),
                  lambda: llama_kernels(b, s, h, a.heads, a.kv_heads, a.ffn, mixed), "flash"),
                 ("GPT (SDPA)", arch_spec("gpt", "p", n_layer=1, hidden=h, heads=a.heads, seq_len=s, vocab=64),
                  lambda: gpt_kernels(b, s, h, a.heads, mixed, True), "flash")]
        for name, spec, prof, att in cases:
            k = prof()
            rows = {"torch.profiler": [(len(m), sum(x.bytes for x in m)) for m in
                                       ([x for x in k[p] if not x.gemm] for p in ("fwd", "bwd"))]}
            for way, ops in (("perfsim eager", eager_block_ops(spec, b, 1, False, bpv, att)),
                             ("perfsim fused", block_ops(spec, b, 1, False, bpv, att))):
                f = [o for o in ops if o.bytes and not o.m and not o.flash]
                bw = [(o.bwd_bytes if o.bwd_bytes is not None else 2 * o.bytes) for o in ops
                      if not o.m and not o.flash and (o.bwd_bytes if o.bwd_bytes is not None else o.bytes)]
                rows[way] = [(len(f), sum(o.bytes for o in f)), (len(bw), sum(bw))]
            for way, ((fk, fb), (bk, bb)) in rows.items():
                print(f"| {name} | {prec} | {way} | {fk} | {fb:,.0f} | {bk} | {bb:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
