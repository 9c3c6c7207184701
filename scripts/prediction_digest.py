"""Predictions before and after a refactor must be bit-identical: this script writes
every figure of a fixed set of predictions, and checks a tree against a stored copy.

    python scripts/prediction_digest.py -o traces/prediction-digest.json   # record
    python scripts/prediction_digest.py --check traces/prediction-digest.json  # compare

The set: the README's ``perfsim predict`` examples (their comma lists expanded), one
case per dimension ``predict`` models (GPU presets, ZeRO stages, mixture-of-experts
with expert parallelism, fp8, recomputation, attention, sequence parallelism,
schedules, topology file, gradient and pipeline compressors, CPU offload, the optimizer) and the
ranked rows of two ``perfsim plan`` searches, two ``perfsim memory`` reports (one with
expert parallelism smaller than data parallelism, which predict refuses), and every row of the
stored validation grids re-predicted with the shipped CPU profile
(``scripts/repredict_validation.py``'s replay of ``perfsim validate --reuse-measured``).

Every summary value is stored as ``repr`` (floats exactly); ``--check`` reports each
case whose values differ, a case that now fails or that is missing. Keys a newer
tree adds are not differences (a refactor may report more).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

LLAMA3 = str(ROOT / "tests" / "data" / "llama-3-8b-config.json")
MIXTRAL = str(ROOT / "tests" / "data" / "configs" / "mixtral-8x7b.json")
GEO = str(ROOT / "perfsim" / "data" / "example-geo-topology.toml")
GPU70B = dict(model="llama2-70b", gpu="h100-sxm5-80gb", tp=8, pp=4, dp=2, micro_batch=1, global_batch=512,
              gpus_per_node=8, bandwidth="400Gbps", precision="bf16", recompute="full")


def cases() -> dict[str, dict]:
    """Name -> ``perfsim.predict`` keyword arguments."""
    out: dict[str, dict] = {"default": {}}
    for bw in ("10Gbps", "1Gbps", "100Mbps"):
        for c in ("fp32", "directq:fw4bw8", "aqsgd:fw3bw6"):
            out[f"readme-bw-{bw}-{c}"] = dict(bandwidth=bw, compress=c)
    for g in ("none", "qsgd-maxnorm:4", "onebit-adam", "onebit-lamb", "powersgd:2", "ecq:2"):
        out[f"pp8-dp4-1f1b-{g}"] = dict(pp=8, dp=4, schedule="1f1b", grad_compress=g)
    for s in ("1f1b", "interleaved-1f1b", "zb-h1", "zb-v"):
        for bw in ("10Gbps", "100Mbps"):
            out[f"schedule-{s}-{bw}"] = dict(schedule=s, virtual_stages=2, bandwidth=bw)
    out["gpu-70b"] = dict(GPU70B)
    out["gpu-70b-flash"] = dict(GPU70B, attention="flash")
    out["gpu-70b-megatron-attention"] = dict(GPU70B, attention="megatron")  # unfused: the scores stored
    out["gpu-70b-sp-zero1"] = dict(GPU70B, sequence_parallel=True, zero=1, placement="tp,dp,pp")
    for z in (1, 2, 3):
        out[f"llama3-zero{z}"] = dict(model=LLAMA3, gpu="h100", tp=8, pp=1, dp=2, micro_batch=1, global_batch=64,
                                      seq_len=8192, gpus_per_node=8, bandwidth="100Gbps", zero=z,
                                      attention="flash", recompute="selective", precision="bf16")
    out["llama3-tp8-pp2-flash"] = dict(model=LLAMA3, gpu="h100", tp=8, pp=2, dp=1, micro_batch=1, global_batch=64,
                                       seq_len=8192, gpus_per_node=8, bandwidth="100Gbps", attention="flash",
                                       recompute="none")
    out["llama3-fp8-selective"] = dict(model=LLAMA3, gpu="h100", tp=4, pp=2, dp=2, micro_batch=1,
                                       global_batch=64, seq_len=4096, gpus_per_node=8, bandwidth="100Gbps",
                                       precision="fp8", recompute="selective")
    if Path(MIXTRAL).exists():
        out["mixtral-ep4"] = dict(model=MIXTRAL, gpu="h100", tp=2, pp=4, dp=4, ep=4, micro_batch=1,
                                  global_batch=64, seq_len=4096, gpus_per_node=8, bandwidth="400Gbps",
                                  recompute="full", allow_oom=True)
        # expert parallelism smaller than data parallelism: the experts' sync over dp/ep = 2 replicas
        out["mixtral-ep8-dp16"] = dict(model=MIXTRAL, gpu="h100", tp=1, pp=1, dp=16, ep=8, micro_batch=1,
                                       global_batch=64, seq_len=4096, gpus_per_node=8, bandwidth="400Gbps",
                                       recompute="full", allow_oom=True)
        # Megatron-Core's combined 1F1B: the all-to-alls beside another micro-batch's compute
        out["mixtral-ep8-overlap"] = dict(model=MIXTRAL, gpu="h100", tp=1, pp=1, dp=8, ep=8, micro_batch=1,
                                          global_batch=64, gpus_per_node=8, nic="8x400Gbps:infiniband",
                                          precision="bf16", recompute="selective", allow_oom=True, ep_overlap=True)
        # the fp8 dispatch all-to-all (DeepSeek-V3), the expert-parallel group over two nodes of 4 GPUs
        out["mixtral-ep8-a2a-fp8"] = dict(model=MIXTRAL, gpu="h100", tp=1, pp=1, dp=8, ep=8, micro_batch=1,
                                          global_batch=64, gpus_per_node=4, nic="4x400Gbps:infiniband",
                                          precision="bf16", recompute="full", allow_oom=True, a2a_compress="fp8")
    # multi-head latent attention (DeepSeek-V2/V3): the latents exchanged by TP 8 under sequence
    # parallelism, fp8 projections; and V2-Lite's direct query projection with unfused attention
    out["deepseek-v3-tp8-sp-fp8"] = dict(model="deepseek-v3", gpu="h100", tp=8, pp=16, dp=8, ep=8, micro_batch=1,
                                         global_batch=1024, gpus_per_node=8, nic="8x400Gbps:infiniband",
                                         precision="fp8", sequence_parallel=True, recompute="selective")
    out["deepseek-v2-lite-tp2-megatron"] = dict(model="deepseek-v2-lite", gpu="a100", tp=2, pp=2, dp=2, ep=2,
                                                micro_batch=1, global_batch=16, gpus_per_node=8, precision="bf16",
                                                attention="megatron", recompute="full")
    # sliding-window attention (Mistral's 4096) at 32k tokens in every block, flash attention, 2 stages
    out["llama-window-32k-tp8"] = dict(model="llama:layers=8,hidden=4096,heads=32,kv_heads=8,ffn=14336,seq=32768,"
                                       "vocab=32768,window=4096", gpu="h100", tp=8, pp=2, dp=1, micro_batch=1,
                                       global_batch=8, gpus_per_node=8, precision="bf16", recompute="selective")
    # gpt-oss-20b: biased experts and router, attention sinks, 128-token local blocks; expert parallel 4
    out["gpt-oss-20b-ep4"] = dict(model="gpt-oss-20b", gpu="h100", tp=1, pp=1, dp=8, ep=4, micro_batch=1,
                                  global_batch=32, seq_len=8192, gpus_per_node=8, precision="bf16", zero=1,
                                  recompute="selective", allow_oom=True)
    # Gemma 2 9B: four norms a block, soft-capped logits (the scores' inside the flash kernel), local blocks
    out["gemma-2-9b-tp4-pp2"] = dict(model="gemma-2-9b", gpu="h100", tp=4, pp=2, dp=1, micro_batch=1,
                                     global_batch=16, gpus_per_node=8, precision="bf16", recompute="selective")
    # DeepSeek-V3's multi-token prediction module on the last stage, sequence parallel, with ZeRO-1
    out["deepseek-v2-lite-mtp-pp2"] = dict(model="deepseek-v2-lite", gpu="h100", tp=2, pp=2, dp=2, ep=2,
                                           micro_batch=1, global_batch=16, gpus_per_node=8, precision="bf16",
                                           sequence_parallel=True, zero=1, mtp_layers=1)
    # Llama 4 Scout at 32k tokens: chunked attention in the rotary blocks, L2 q/k norms, a shared expert
    out["llama-4-scout-32k-ep4"] = dict(model="llama-4-scout", seq_len=32768, gpu="h100", gpus_per_node=8,
                                        nic="8x400Gbps:infiniband", tp=8, pp=1, dp=4, ep=4, zero=1, micro_batch=1,
                                        global_batch=32, precision="bf16", recompute="full", sequence_parallel=True)
    # Qwen3-Next: Gated DeltaNet blocks (the state pass by the SMs it fills), gated attention, 512 experts, MTP
    out["qwen3-next-tp2-ep4"] = dict(model="qwen3-next-80b-a3b", gpu="h100", gpus_per_node=8, nic="8x400Gbps:infiniband",
                                     tp=2, pp=2, dp=4, ep=4, zero=1, micro_batch=1, global_batch=32, precision="bf16",
                                     recompute="full", attention="flash", sequence_parallel=True, allow_oom=True)
    # context parallelism at 128k tokens: a rank's shard, the ring across nodes, gradients over dp x cp
    out["llama3-8b-128k-cp8"] = dict(model="llama3-8b", seq_len=131072, gpu="h100", gpus_per_node=8,
                                     nic="8x400Gbps:infiniband", tp=8, cp=8, pp=1, dp=1, micro_batch=1, global_batch=8,
                                     precision="bf16", attention="flash", recompute="selective", sequence_parallel=True)
    out["gpu-70b-sgd-zero1"] = dict(GPU70B, optimizer="sgd", zero=1)  # SGD-momentum's state and step
    out["cpu-profile-sgd"] = dict(model="gpt2-tiny", pp=2, profile=str(ROOT / "traces" / "cpu-2core.json"),
                                  optimizer="sgd", bandwidth="100Mbps")
    # CPU offload of the optimizer (ZeRO-Offload) on ZeRO-2, 8 H100s of one node
    out["llama2-7b-zero2-offload"] = dict(model="llama2-7b", gpu="h100", tp=1, pp=1, dp=8, micro_batch=1,
                                          global_batch=64, gpus_per_node=8, bandwidth="400Gbps", precision="bf16",
                                          zero=2, recompute="full", offload="optimizer")
    out["geo-topology"] = dict(model="gpt2-tiny", pp=3, topology=GEO, compress="fp16")
    out["a100-fp16-megatron"] = dict(model="gpt:layers=24,hidden=2048,heads=16,seq=2048,vocab=51200",
                                     gpu="a100-sxm4-80gb", tp=2, pp=2, dp=2, micro_batch=4, global_batch=64,
                                     gpus_per_node=8, precision="fp16")
    out["wan-tied-sync"] = dict(model="gpt2-tiny", pp=2, dp=2, bandwidth="100Mbps", tied_embedding="sync",
                                grad_compress="qsgd-maxnorm:2", compress="aqsgd:fw2bw4:m8")
    return out


#: ``perfsim.plan`` cases (the README's small example and a GPU one): every ranked row
PLANS = {
    "plan-gpt2-tiny-100Mbps": dict(model="gpt2-tiny", profile=str(ROOT / "traces" / "cpu-2core.json"), nodes=2,
                                   bandwidth="100Mbps", global_batch=32),
    "plan-gpt2-h100": dict(model="gpt2", gpu="h100", nodes=1, gpus_per_node=4, bandwidth="10Gbps",
                           global_batch=16),
}


def _values(summary: dict) -> dict[str, str]:
    """Every value as ``repr``; paths inside the checkout relative to it (so a worktree
    or a fresh clone compares equal)."""
    return {k: repr(v).replace(str(ROOT), "<root>") for k, v in sorted(summary.items()) if not callable(v)}


def predictions() -> dict[str, dict]:
    import perfsim

    out: dict[str, dict] = {}
    for name, kw in cases().items():
        try:
            out[name] = _values(perfsim.predict(**kw).summary)
        except Exception as exc:  # noqa: BLE001 -- recorded, so a change in refusal shows too
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    for name, kw in PLANS.items():
        try:
            res = perfsim.plan(**kw)
            out[name] = {f"{i}.{k}": v for i, row in enumerate(res.rows()) for k, v in _values(row).items()}
            out[name].update(counts=repr((res.evaluated, res.pruned, res.rejected, res.total)))
        except Exception as exc:  # noqa: BLE001
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    try:
        import dataclasses

        out["memory-70b"] = _values(dataclasses.asdict(perfsim.memory_report(**GPU70B)))
    except Exception as exc:  # noqa: BLE001
        out["memory-70b"] = {"error": f"{type(exc).__name__}: {exc}"}
    # expert parallelism smaller than data parallelism: memory only (predict refuses it)
    mixtral = dict(model=MIXTRAL, gpu="h100", tp=1, pp=1, dp=8, ep=2, gpus_per_node=8, precision="bf16",
                   recompute="full", global_batch=64)
    try:
        out["memory-mixtral-ep2-dp8"] = _values(dataclasses.asdict(perfsim.memory_report(**mixtral)))
    except Exception as exc:  # noqa: BLE001
        out["memory-mixtral-ep2-dp8"] = {"error": f"{type(exc).__name__}: {exc}"}
    from repredict_validation import GRIDS, STORED, repredict_frame

    profile = str(ROOT / "traces" / "cpu-2core.json")
    with tempfile.TemporaryDirectory() as tmp:
        for grid in GRIDS:
            df = repredict_frame(STORED / grid, profile, Path(tmp) / grid)
            for i, row in df.iterrows():
                vals = {k: row[k] for k in df.columns if k.startswith("predicted_")}
                out[f"grid-{grid}-{i:02d}"] = {k: repr(None if isinstance(v, float) and math.isnan(v) else v)
                                               for k, v in sorted(vals.items())}
    return out


def compare(new: dict[str, dict], ref: dict[str, dict]) -> list[str]:
    diffs = []
    for name, old in ref.items():
        cur = new.get(name)
        if cur is None:
            diffs.append(f"{name}: missing")
            continue
        bad = [f"{k}: {old[k]} -> {cur.get(k, '<absent>')}" for k in old if cur.get(k) != old[k]]
        if bad:
            diffs.append(f"{name}: " + "; ".join(bad[:6]) + (f" (+{len(bad) - 6} more)" if len(bad) > 6 else ""))
    return diffs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("-o", "--out", help="write the digest here (JSON)")
    g.add_argument("--check", metavar="REF", help="compare with a stored digest; exit 1 on any difference")
    args = ap.parse_args(argv)
    new = predictions()
    if args.out:
        tmp = Path(args.out + ".tmp")
        tmp.write_text(json.dumps(new, indent=1, sort_keys=True) + "\n")
        tmp.replace(args.out)
        print(f"{len(new)} predictions -> {args.out}")
        return 0
    diffs = compare(new, json.loads(Path(args.check).read_text()))
    for d in diffs:
        print(d)
    print(f"{len(new)} predictions, {len(diffs)} differ from {args.check}")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
