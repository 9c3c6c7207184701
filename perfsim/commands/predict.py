"""``perfsim predict``: simulate pipeline x data-parallel training with compression.

With no argument it runs the embedded default (GPT2-1.5B on 8 stages, the
AQ-SGD paper's V100 profile, 10 Gbps). Comma lists simulate every combination.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys

from perfsim.errors import ConfigError

HELP = "simulate training throughput over a network with communication compression"
from perfsim.collectives import ALGORITHMS
from perfsim.fabrics import FABRICS
from perfsim.link import LINK_MODELS

#: flag -> api parameter; these accept comma lists (every combination is run)
LIST_FLAGS = ("model", "bandwidth", "latency", "compress", "grad_compress", "schedule", "pp", "dp",
              "micro_batch", "macro_batch", "tp", "gpu", "precision", "recompute", "global_batch")


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload")
    g.add_argument("--model", default="gpt2-xl",
                   help="model preset(s) (gpt2-xl, bert-large, llama2-70b, gpt3-175b ...), an inline transformer "
                        "gpt:layers=96,hidden=12288,heads=96,seq=2048,vocab=51200[,ffn=..,kv_heads=..] "
                        "(also llama:/bert:/neox:), or a Hugging Face config.json (default gpt2-xl)")
    g.add_argument("--seq-len", help="sequence length of a transformer model (default: the preset's)")
    g.add_argument("--workload", help="workload file (TOML/JSON) instead of a preset")
    g.add_argument("--profile", help="calibration profile (default: traces/default-v100-aqsgd.json)")
    g = p.add_argument_group("strategy")
    g.add_argument("--compress", default="fp32", help="pipeline compression, e.g. fp32,directq:fw4bw8,aqsgd:fw3bw6")
    g.add_argument("--grad-compress", default="none", help="data-parallel gradient compression, e.g. none,qsgd-maxnorm:4")
    g.add_argument("--schedule", help="gpipe, 1f1b, interleaved-1f1b, zb-h1 or zb-v (comma list allowed; "
                                      "default gpipe, 1f1b as Megatron-LM when --gpu is given)")
    g.add_argument("--virtual-stages", default=None,
                   help="model chunks per device of interleaved-1f1b (default 2; the other "
                        "schedules run their own: zb-v 2, the rest 1)")
    g.add_argument("--pp", default="8", help="pipeline stages (default 8)")
    g.add_argument("--dp", default="1", help="data-parallel replicas (default 1)")
    g.add_argument("--micro-batch", default="1", help="samples per micro-batch (default 1)")
    g.add_argument("--macro-batch", help="samples per macro-batch per replica (default 32, or global-batch / dp)")
    g.add_argument("--global-batch", help="samples per optimizer step over all replicas "
                                          "(= dp x micro-batch x accumulation steps)")
    g.add_argument("--tp", default="1", help="tensor-parallel degree, Megatron-style (default 1)")
    g.add_argument("--sequence-parallel", action="store_true",
                   help="Megatron sequence parallelism (reduce-scatter/all-gather instead of all-reduce)")
    g.add_argument("--placement",
                   help="rank order, innermost first (default tp,pp,dp: replica-major; with --gpu "
                        "Megatron's tp,dp,pp; TP innermost keeps a TP group inside a node)")
    g.add_argument("--precision", default="fp32", help="fp32, tf32, bf16 or fp16 (mixed precision; default fp32)")
    g.add_argument("--recompute", default="none", help="activation recomputation: none, selective, full")
    g.add_argument("--zero", default="0", help="ZeRO stage: 0 or 1 (optimizer state sharded over dp)")
    g.add_argument("--allow-oom", action="store_true", help="predict a configuration that does not fit in memory")
    g.add_argument("--partition", help="layer counts per stage, e.g. 7,6,6,6,6,6,6,7 (default: balanced)")
    g.add_argument("--bucket-size", default="25MiB", help="gradient bucket size (default 25MiB)")
    g.add_argument("--no-overlap", action="store_true", help="sync gradients only after the backward pass")
    g.add_argument("--epochs", default="1", help="epochs for the end-to-end time (default 1)")
    g.add_argument("--dataset-samples", default="2359", help="samples per epoch (default 2359)")
    g = p.add_argument_group("system")
    g.add_argument("--bandwidth", default=None,
                   help="link rate(s) with a unit (b = bit, B = byte), e.g. 10Gbps,1Gbps,100Mbps; each "
                        "node's NIC has this rate, shared by its GPUs (default 10Gbps)")
    g.add_argument("--latency", default=None, help="one-way latency(ies) with a unit, e.g. 5ms (default 0)")
    g.add_argument("--topology", help="heterogeneous topology file (JSON/TOML/CSV, see perfsim.network); "
                                      "replaces --bandwidth/--latency; a node's NIC defaults to its fastest "
                                      "link, shared by its GPUs as under --bandwidth")
    g.add_argument("--gpus-per-node", default="1", help="devices per node (default 1)")
    g.add_argument("--gpu", help="GPU preset (a100-sxm4-80gb, h100-sxm5-80gb, ...; perfsim.hardware): compute "
                                 "from its operator model, memory checked against its capacity")
    g.add_argument("--intra-node-bandwidth", default="300GB/s", help="intra-node rate (default 300GB/s)")
    g.add_argument("--no-nic-sharing", action="store_true", help="give every flow the full link (lower bound)")
    g.add_argument("--link-burst", default="0B",
                   help="token-bucket depth of each link, bytes that leave at once after idling "
                        "(Linux tbf burst), e.g. 50KB (default 0: a plain fixed-rate link)")
    g.add_argument("--p2p-protocol", choices=("eager", "rendezvous"), default="eager",
                   help="eager: a send starts at once (NCCL-like, default); rendezvous: it starts when "
                        "the receiver has posted its receive (gloo over TCP)")
    g.add_argument("--intra-node-fabric", choices=tuple(FABRICS),
                   help="intra-node fabric preset with its achieved bus bandwidth (perfsim.fabrics; "
                        "replaces --intra-node-bandwidth)")
    g.add_argument("--nic", help="NICs of a node, [COUNTx]RATE[:KIND], e.g. 4x200Gbps:infiniband; their "
                                 "total replaces --bandwidth, KIND (ethernet|infiniband|ideal, default ethernet) "
                                 "gives the transport efficiency of an uncalibrated link")
    g.add_argument("--collective-algo", choices=ALGORITHMS, default="auto",
                   help="allreduce algorithm: auto (least modelled time, as NCCL's tuner), ring, tree "
                        "(double binary tree) or hierarchical (default auto)")
    g.add_argument("--link-model", choices=LINK_MODELS, default="auto",
                   help="auto: the profile's measured link at this rate if any, else nominal x NIC efficiency; "
                        "calibrated: require the measurement; nominal: ignore it (default auto)")
    g.add_argument("--comm-slowdown", help="compute slowdown while communication overlaps it, e.g. 0.1 "
                                           "(default: the profile's measured interference, else 0)")
    g = p.add_argument_group("output")
    g.add_argument("--format", choices=("table", "csv", "json", "parquet"),
                   help="output format (default: from --out's suffix .txt/.csv/.json/.parquet, else table)")
    g.add_argument("--out", "-o", "--output", dest="output", help="write to FILE (atomically; a FIFO or device in place) instead of stdout")
    g.add_argument("--trace", help="write a Chrome/Perfetto trace of the timeline (FILE.json)")


def _grid(args) -> list[dict]:
    from perfsim.units import split_list

    lists = {}
    for name in LIST_FLAGS:
        raw = getattr(args, name)
        if raw is None:  # not given: the API's default (and no clash with --topology)
            lists[name] = [None]
            continue
        values = _split_models(raw) if name == "model" else split_list(raw)
        if not values:
            raise ConfigError(f"--{name.replace('_', '-')} {raw!r}: empty")
        lists[name] = values
    common = dict(workload=args.workload, profile=args.profile, topology=args.topology,
                  partition=args.partition, bucket_size=args.bucket_size, overlap=not args.no_overlap,
                  epochs=args.epochs, dataset_samples=args.dataset_samples, gpus_per_node=args.gpus_per_node,
                  intra_node_bandwidth=args.intra_node_bandwidth, nic_sharing=not args.no_nic_sharing,
                  link_burst=args.link_burst, p2p_protocol=args.p2p_protocol, seq_len=args.seq_len,
                  sequence_parallel=args.sequence_parallel, placement=args.placement, zero=args.zero,
                  allow_oom=args.allow_oom, intra_node_fabric=args.intra_node_fabric, nic=args.nic,
                  collective_algo=args.collective_algo, link_model=args.link_model,
                  comm_slowdown=args.comm_slowdown, virtual_stages=args.virtual_stages)
    names = list(lists)
    return [{**common, **dict(zip(names, combo))} for combo in itertools.product(*(lists[n] for n in names))]


def _split_models(raw: str) -> list[str]:
    """Comma list of models where an inline spec's own ``key=value`` items stay with it:
    ``gpt2-xl,gpt:layers=2,hidden=64,...`` -> two models."""
    out: list[str] = []
    for item in (x.strip() for x in str(raw).split(",")):
        if out and "=" in item and ":" not in item:
            out[-1] += "," + item
        elif item:
            out.append(item)
    return out


def _trace_path(base: str, i: int, n: int) -> str:
    if n == 1:
        return base
    stem, dot, ext = base.rpartition(".")
    return f"{stem}-{i}.{ext}" if dot else f"{base}-{i}"


def _csv(results) -> str:
    import csv
    import io

    rows = [r.row() for r in results]
    cols = list(rows[0])
    for row in rows[1:]:
        cols += [k for k in row if k not in cols]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def _json(results) -> str:
    return json.dumps([r.to_json_dict() for r in results], indent=1, default=str, allow_nan=False) + "\n"


def _parquet(results) -> bytes:
    import io

    import pandas as pd

    buf = io.BytesIO()
    pd.DataFrame([r.row() for r in results]).to_parquet(buf, index=False)
    return buf.getvalue()


def run(args) -> int:
    from perfsim import outputs
    from perfsim.api import predict

    fmt = outputs.output_format(args.output, args.format, flag="--out")  # unknown suffix, no pyarrow: before any work
    if args.output:
        outputs.check_file_target(args.output, "--out")
    elif fmt == "parquet":
        raise ConfigError("--format parquet: needs --output FILE (Parquet is binary)")
    if args.trace:
        outputs.check_file_target(args.trace, "--trace")
    grid = _grid(args)
    results = []
    for i, params in enumerate(grid):
        res = predict(**params, trace=bool(args.trace))
        if args.trace:
            res.write_trace(_trace_path(args.trace, i, len(grid)))
            res.trace_events = []
        results.append(res)
    if fmt == "csv":
        data = _csv(results).encode()
    elif fmt == "json":
        data = _json(results).encode()
    elif fmt == "parquet":
        data = _parquet(results)
    else:
        from perfsim.commands._predict_table import render

        if not args.output:
            render(results, file=sys.stdout)
            return 0
        data = render(results, width=160, color=False).encode()
    if args.output:
        outputs.write_bytes(args.output, data)
        print(f"wrote {args.output} ({len(results)} configuration{'s' * (len(results) != 1)})", file=sys.stderr)
    else:
        outputs.write_stdout(data.decode())
    return 0
