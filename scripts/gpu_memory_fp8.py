"""Three GPU checks behind docs/model.md ("The loss's memory", "fp8 on Hopper"):

1. the peak memory of a plain PyTorch GPT-2 124M training step (fp32 parameters, bf16
   autocast, SDPA attention, fp32 ``F.cross_entropy`` over 50257 tokens, AdamW, micro-batch
   16 x 1024), the logits kept by the caller (nanoGPT's ``logits, loss = model(x, y)``)
   or dropped before the backward;
2. bf16 against fp8 (e4m3, ``torch._scaled_mm``) GEMM rates on the block and LM-head
   shapes, as a fraction of the datasheet's dense peaks
   (traces/gpu/h100-memory-fp8-2026-11-27.json holds 1 and 2);
3. the activation bytes one block keeps after its forward (0, 6 and 12 blocks on the
   embedding, micro-batch 16 x 1024), under autocast with fp32 parameters and with the
   blocks cast to bf16 (traces/gpu/h100-block-activations-2026-11-27.json).

    python3 scripts/gpu_memory_fp8.py [--out FILE.json] [--small]

Needs torch with CUDA (``--small``: a tiny model on the CPU, memory part only, to test the
script). Writes one JSON object. (The stored files came from a compacted copy of these
functions, the device's command line being limited to 2000 characters.)
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

GIB = 2**30


class Block(nn.Module):
    def __init__(self, h: int, heads: int):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.c_attn, self.c_proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.c_fc, self.mlp_proj = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)
        self.heads = heads

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    """GPT-2 (nanoGPT's layout: pre-LN blocks, tied LM head, no dropout)."""

    def __init__(self, layers=12, h=768, heads=12, vocab=50257, seq=1024):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, h), nn.Embedding(seq, h)
        self.blocks = nn.ModuleList(Block(h, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(h)
        self.lm_head = nn.Linear(h, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def step_memory(keep_logits: bool, cfg: dict, mb: int, device: str) -> dict:
    torch.manual_seed(0)
    model = GPT(**cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, cfg["vocab"], (mb, cfg["seq"]), device=device)
    y = torch.randint(0, cfg["vocab"], (mb, cfg["seq"]), device=device)
    cuda = device == "cuda"
    out = {"keep_logits": keep_logits, "params": sum(p.numel() for p in model.parameters())}
    for i in range(3):
        if cuda and i == 2:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            out["states_gib"] = torch.cuda.memory_allocated() / GIB
        with torch.autocast(device, dtype=torch.bfloat16):
            logits, loss = model(x, y)
        if cuda and i == 2:
            out["after_forward_gib"] = torch.cuda.memory_allocated() / GIB
        if not keep_logits:
            del logits
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if keep_logits:
            del logits
    if cuda:
        torch.cuda.synchronize()
        out["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / GIB
        out["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / GIB
    out["loss"] = float(loss)
    del model, opt
    if cuda:
        torch.cuda.empty_cache()
    return out


def block_activations(layers: int, mode: str, mb: int = 16, seq: int = 1024, h: int = 768) -> int:
    """Bytes held after the forward of ``layers`` blocks on the embedding (``mode``:
    ``autocast`` -- fp32 parameters under bf16 autocast -- or ``bf16``, the blocks cast)."""
    torch.manual_seed(0)
    emb = nn.Embedding(50257, h).cuda()
    blocks = nn.ModuleList(Block(h, 12) for _ in range(layers)).cuda()
    if mode == "bf16":
        emb, blocks = emb.bfloat16(), blocks.bfloat16()
    idx = torch.randint(0, 50257, (mb, seq), device="cuda")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=mode == "autocast"):
        x = emb(idx)
        for blk in blocks:
            x = blk(x)
        loss = x.float().square().mean()
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - before
    loss.backward()
    del x, loss, emb, blocks
    torch.cuda.empty_cache()
    return held


def _time(fn, iters: int = 20) -> float:
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def gemm_rates(shapes) -> list[dict]:
    rows = []
    one = torch.ones((), device="cuda", dtype=torch.float32)
    for m, n, k in shapes:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
        flops = 2.0 * m * n * k
        row = {"m": m, "n": n, "k": k, "bf16_tflops": flops / _time(lambda: a @ b.t()) / 1e12}
        for fast in (False, True):
            t = _time(lambda: torch._scaled_mm(a8, b8.t(), one, one, out_dtype=torch.bfloat16,
                                               use_fast_accum=fast))
            row[f"fp8{'_fast' if fast else ''}_tflops"] = flops / t / 1e12
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
        del a, b, a8, b8
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--out", default=None)
    ap.add_argument("--small", action="store_true")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() and not args.small else "cpu"
    cfg = dict(layers=12, h=768, heads=12, vocab=50257, seq=1024)
    mb = 16
    if args.small:
        cfg, mb = dict(layers=2, h=64, heads=4, vocab=512, seq=64), 2
    result = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
              "model": cfg, "micro_batch": mb,
              "steps": [step_memory(keep, cfg, mb, device) for keep in (True, False)]}
    print(json.dumps(result["steps"]), file=sys.stderr, flush=True)
    if device == "cuda":
        result["blocks"] = {}
        for mode in ("autocast", "bf16"):
            held = {f"L{n}": block_activations(n, mode) for n in (0, 6, 12)}
            held["per_block_bytes_per_sbh"] = (held["L12"] - held["L0"]) / 12 / (16 * 1024 * 768)
            result["blocks"][mode] = held
        h, tok = 768, mb * 1024
        result["gemms"] = gemm_rates([(tok, 3 * h, h), (tok, h, h), (tok, 4 * h, h), (tok, h, 4 * h),
                                      (tok, 50304, h), (8192, 8192, 8192), (16384, 12288, 4096),
                                      (16384, 4096, 11008), (16384, 11008, 4096)])
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
