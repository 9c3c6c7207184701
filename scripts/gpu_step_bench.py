"""Time whole training steps of a GPT on one GPU, for checking the compute model end to end.

One step = forward, loss, backward and a fused AdamW step of a GPT built from execute
mode's own modules (:mod:`perfsim.runtime.models`: embedding, pre-LN blocks, LM head),
with every parameter in ``--dtype`` (pure bf16/fp16 training: no fp32 master copy).
Attention: ``flash`` or ``math`` run execute mode's block (no dropout) through
``scaled_dot_product_attention`` with that backend forced (FlashAttention-2, one fused
kernel; PyTorch's unfused reference path); ``megatron`` runs Megatron-LM's attention and
dropouts (:func:`megatron_block`), the operators :mod:`perfsim.models.ops` lists;
``megatron-flash`` the same block with FlashAttention-2 as its attention core
(``perfsim predict --attention flash``). Prints one CSV row per configuration: the median step time of
``--steps`` steps after ``--warmup``, each step bracketed by device synchronisations.

    python scripts/gpu_step_bench.py --hidden 1024,2048 --micro-batch 1,2,4,8 > steps.csv

Compare with ``perfsim predict --model gpt:layers=L,hidden=H,heads=A,seq=S,vocab=V
--gpu h200-sxm-141gb --tp 1 --pp 1 --dp 1 --micro-batch M --global-batch M
--precision bf16 --recompute none`` (docs/gpu.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def megatron_block(spec, dropout: float, flash: bool = False):
    """Execute mode's block with Megatron-LM's attention and dropouts (megatron/model/
    transformer.py, ``CoreAttention``): ``baddbmm`` scores scaled by ``1/sqrt(d)``, the
    causal mask, softmax, dropout on the probabilities, ``bmm`` with the values; dropout
    before each residual add. ``flash``: the attention core is FlashAttention-2 instead
    (``scaled_dot_product_attention``, no attention dropout, Megatron's ``--use-flash-attn``
    with ``--attention-dropout 0``), the hidden dropouts stay."""
    import math

    from perfsim.runtime.models import Block

    class MegatronBlock(Block):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, d = x.shape
            q, k, v = (z.reshape(b, t, self.n_head, self.head_dim).transpose(1, 2)
                       for z in self.qkv(self.ln1(x)).chunk(3, dim=2))
            if flash:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                q, k, v = (z.reshape(b * self.n_head, t, -1) for z in (q, k, v))
                scores = torch.baddbmm(torch.empty(b * self.n_head, t, t, device=x.device, dtype=x.dtype), q,
                                       k.transpose(1, 2), beta=0.0, alpha=1.0 / math.sqrt(self.head_dim))
                mask = torch.ones(t, t, device=x.device, dtype=torch.bool).triu_(1)
                probs = F.dropout(torch.softmax(scores.masked_fill_(mask, -10000.0), dim=-1), dropout, True)
                y = torch.bmm(probs, v).reshape(b, self.n_head, t, -1)
            x = x + F.dropout(self.proj(y.transpose(1, 2).flatten(2)), dropout, True)
            return x + F.dropout(self.fc_proj(F.gelu(self.fc(self.ln2(x)))), dropout, True)

    return MegatronBlock(spec)


def build(layers: int, hidden: int, heads: int, seq: int, vocab: int, device: str, dtype: torch.dtype,
          attention: str = "flash", dropout: float = 0.1):
    from perfsim.models.transformer import arch_spec
    from perfsim.runtime.models import Block, Embed, Head

    spec = arch_spec("gpt", "bench", n_layer=layers, hidden=hidden, heads=heads, seq_len=seq, vocab=vocab)
    blocks = [megatron_block(spec, dropout, attention == "megatron-flash") if attention.startswith("megatron")
              else Block(spec) for _ in range(layers)]
    return torch.nn.Sequential(Embed(spec), *blocks, Head(spec)).to(device=device, dtype=dtype).train()


def backend(name: str):
    import contextlib

    from torch.nn.attention import SDPBackend, sdpa_kernel

    if name == "megatron":
        return contextlib.nullcontext()
    return sdpa_kernel({"flash": SDPBackend.FLASH_ATTENTION, "megatron-flash": SDPBackend.FLASH_ATTENTION,
                        "math": SDPBackend.MATH}[name])


def step_time(model, opt, mb: int, seq: int, vocab: int, device: str, attention: str, warmup: int, steps: int
              ) -> float:
    g = torch.Generator(device=device).manual_seed(0)
    idx = torch.randint(0, vocab, (mb, seq), device=device, generator=g)
    tgt = torch.randint(0, vocab, (mb * seq,), device=device, generator=g)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    times = []
    with backend(attention):
        for i in range(warmup + steps):
            sync()
            t0 = time.perf_counter()
            loss = F.cross_entropy(model(idx).reshape(-1, vocab).float(), tgt)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--hidden", default="1024,2048", help="comma list")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=50304, help="default: GPT-2's 50257 padded to a multiple of 128")
    ap.add_argument("--micro-batch", default="1,2,4,8", help="comma list")
    ap.add_argument("--attention", default="megatron,flash", help="comma list of megatron, megatron-flash, flash, math")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    print("layers,hidden,heads,seq,vocab,micro_batch,attention,dtype,device,step_s", flush=True)
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    for hidden in (int(h) for h in args.hidden.split(",")):
        for attention in args.attention.split(","):
            model = build(args.layers, hidden, args.heads, args.seq, args.vocab, args.device, dtype, attention)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=args.device == "cuda")
            for mb in (int(m) for m in args.micro_batch.split(",")):
                t = step_time(model, opt, mb, args.seq, args.vocab, args.device, attention, args.warmup,
                              args.steps)
                print(f"{args.layers},{hidden},{args.heads},{args.seq},{args.vocab},{mb},{attention},"
                      f"{args.dtype},{name},{t:.6f}", flush=True)
            del model, opt
            if args.device == "cuda":
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
