"""Predict published multi-node nccl-tests rows with perfsim's own collective model and report the
error, signed: (predicted - measured) / measured time, negative = too fast.

Data: ``traces/open/nccl-tests-multinode.json`` (the *validation* rows: looked at while perfsim's
collective model was built) and ``traces/open/nccl-tests-multinode-2.json`` (the *held-out* rows:
collected under the same rule after the model and its defaults were chosen, predicted once) -- rows of
``all_reduce_perf`` as posted in public GitHub threads, each run's hardware as its thread states it,
the selection rule (written before any row was predicted) and every source looked at and left out,
with the reason. Nothing is fitted to these rows.

Each set is priced the way ``perfsim predict`` prices a data-parallel or tensor-parallel collective:
its stated hardware through predict's own keywords (``gpu`` = the set's ``gpu_preset``, so that its
collectives are NCCL's as predict prices a GPU job's, ``gpus_per_node``, ``nic`` = count x rate : kind,
``intra_node_fabric``, a forced ``NCCL_ALGO`` as ``collective_algo``; a node's GPUs and NICs as stated
even where the run used fewer GPUs, ``ranks_per_node``, its ranks then the first GPUs of each node), parsed by
:func:`perfsim.api.build_configs` into the ``System`` predict builds, the network of
:class:`perfsim.network.analytic.Network`, and :meth:`~perfsim.network.collectives.CollectivePricing.collective`
-- the one entry point of every collective perfsim prices. Its time is the uncontended one (one
collective at a time, as nccl-tests runs them). Bus bandwidth is nccl-tests' (its
``doc/PERFORMANCE.md``): the bytes each rank of a flat ring puts on the wire over the time, the count
:func:`perfsim.network.collectives.collective_cost` gives.

    python scripts/nccl_open_data.py                                # every row, each set's MAPE and signed error
    python scripts/nccl_open_data.py --set collective_model=nccl    # any predict keyword, to switch a mechanism
    python scripts/nccl_open_data.py --mechanism off                # NCCL's overlapped steps off (collective_model nominal)
    python scripts/nccl_open_data.py --ib-efficiency 0.96           # the infiniband kind at another payload share
    python scripts/nccl_open_data.py --only h100-roce-2x1-tree --set nic_affinity=node   # one set, a lone GPU on every NIC
    python scripts/nccl_open_data.py --check                        # the figures stored in the file (``reported``)
    python scripts/nccl_open_data.py --update                       # rewrite ``reported`` after a deliberate change

``stated_peaks``: the per-NIC busbw NVIDIA's NCCL maintainers state they measure (no rows, outside the
MAPE), beside perfsim's per-NIC busbw of a large ring all-reduce on 2 nodes of 8 GPUs, one NIC per GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import sys
from pathlib import Path

from perfsim.api import build_configs
from perfsim.errors import ConfigError
from perfsim.fabrics import NIC_KINDS
from perfsim.network.analytic import Network
from perfsim.network.collectives import collective_cost
from perfsim.outputs import json_text, write_text
from perfsim.param_values import assignments

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "traces" / "open" / "nccl-tests-multinode.json"
#: the held-out rows (module docstring)
HELD_OUT = ROOT / "traces" / "open" / "nccl-tests-multinode-2.json"
#: each file's role -> its path, in the order they are printed
FILES = {"validation": DATA, "held-out": HELD_OUT}
#: ``--mechanism``: the collective model it selects (perfsim.collectives.COLLECTIVE_MODELS)
MECHANISM = {"on": "pipelined", "off": "nominal"}
#: nccl-tests' collective names -> perfsim's kinds (perfsim.collectives.KINDS)
KINDS = {"allreduce": "allreduce", "allgather": "allgather", "reduce_scatter": "reduce_scatter"}
#: a forced NCCL_ALGO -> perfsim's collective_algo (perfsim.collectives.ALGORITHMS)
ALGOS = {None: "auto", "Ring": "ring", "Tree": "tree"}
#: the size of a large message for the stated per-NIC peaks (8 GiB: the bandwidth term dominates)
PEAK_BYTES = 8 * 2**30
#: the GPU preset of the stated peaks' nodes (H100 SXM nodes, as ``nvlink4``)
PEAK_GPU = "h100-sxm5-80gb"
#: the keywords that state a peak's hardware: a --set of one of them applies to the sets only
PEAK_HARDWARE = ("nic", "gpus_per_node", "intra_node_fabric", "collective_algo", "gpu")
#: how close --check wants a recomputed figure to the stored one (rounding of the stored figures)
TOLERANCE = {"pct": 0.01, "us": 0.05}


def load(path: Path = DATA) -> dict:
    return json.loads(Path(path).read_text())


def rows_of(s: dict, columns: list[str]) -> list[dict]:
    return [dict(zip(columns, r)) for r in s["rows"]]


def per_rank_bytes(kind: str, size: float, n: int) -> float:
    """perfsim's per-rank buffer of a row: nccl-tests' ``size`` is the per-rank buffer of an
    allreduce and a reduce-scatter's input, the whole gathered buffer of an allgather
    (perfsim's ``S`` of an allgather is each rank's contribution: :mod:`perfsim.collectives`)."""
    return size / n if kind == "allgather" else float(size)


def busbw(kind: str, size: float, n: int, time_s: float) -> float:
    """nccl-tests' bus bandwidth, bytes/s: the bytes each rank of a flat ring puts on the wire
    (:func:`perfsim.network.collectives.collective_cost`) over the time."""
    return collective_cost(kind, per_rank_bytes(kind, size, n), n)[0] / time_s


def ranks_per_node(s: dict) -> int:
    """The GPUs of each node set ``s``'s run used (``ranks_per_node``; default: all of the node's
    ``gpus_per_node``)."""
    return s.get("ranks_per_node", s["gpus_per_node"])


def members(s: dict) -> list[int]:
    """The run's ranks among the devices of its nodes: the first ``ranks_per_node`` GPUs of each node."""
    return [node * s["gpus_per_node"] + i for node in range(s["nodes"]) for i in range(ranks_per_node(s))]


def network(s: dict, extra: dict | None = None):
    """(the Network predict builds for set ``s``'s stated hardware, the run's ranks on it). A node is
    its stated GPUs and NICs (``gpus_per_node``, ``nic``) whether the run used every GPU or not, so
    that the NICs one GPU reaches are the node's share of them (``nic_affinity`` gpu,
    :func:`perfsim.fabrics.gpu_nic_share`). The model and batch only complete predict's description
    of a job (one data-parallel replica per GPU); the network reads none of them. The profile is
    predict's default: it measured no link at these rates, so the links are nominal x the NIC kind's
    share (``--link-model auto``)."""
    n = s["nodes"] * s["gpus_per_node"]
    kw = dict(model="gpt2-xl", gpu=s["gpu_preset"], pp=1, dp=n, micro_batch=1, global_batch=n,
              gpus_per_node=s["gpus_per_node"],
              nic=s["nic"], intra_node_fabric=s["intra_node_fabric"], collective_algo=ALGOS[s["nccl_algo"]])
    kw.update(extra or {})
    _, _, system, profile = build_configs(**kw)
    return Network(system, n, profile), members(s)


def predict_set(s: dict, columns: list[str], extra: dict | None = None) -> list[dict]:
    """Per row: measured and predicted time (us) and busbw (GB/s), the algorithm perfsim picked,
    the signed error of the time (%)."""
    net, ranks = network(s, extra)
    n = len(ranks)
    kind = KINDS[s["collective"]]
    out = []
    for r in rows_of(s, columns):
        c = net.collective(kind, per_rank_bytes(kind, r["size_bytes"], n), ranks)
        t = c.time()
        out.append(dict(set=s["id"], size_bytes=r["size_bytes"], measured_us=r["time_us"], predicted_us=1e6 * t,
                        measured_busbw=r["busbw_GBps"], predicted_busbw=busbw(kind, r["size_bytes"], n, t) / 1e9,
                        algo=c.algo, error_pct=100.0 * (1e6 * t - r["time_us"]) / r["time_us"]))
    return out


def summary(res: list[dict]) -> dict:
    """Rows, MAPE and mean signed error (%); both None for no rows."""
    e = [r["error_pct"] for r in res]
    if not e:
        return dict(rows=0, mape_pct=None, mean_signed_pct=None)
    return dict(rows=len(e), mape_pct=sum(abs(x) for x in e) / len(e), mean_signed_pct=sum(e) / len(e))


def stated_peaks(doc: dict, extra: dict | None = None) -> list[dict]:
    """Per stated peak: perfsim's busbw per NIC of an 8 GiB ring all-reduce on 2 nodes of 8 GPUs with
    8 NICs of the stated rate (``infiniband``) on NVSwitch H100 nodes (``nvlink4``, 370 GB/s: it binds
    only where the 8 NICs achieve more), beside the stated figure."""
    out = []
    extra = {k: v for k, v in (extra or {}).items() if k not in PEAK_HARDWARE}
    for p in doc["stated_peaks"]["peaks"]:
        s = dict(id="peak", nodes=2, gpus_per_node=8, nic=f"8x{p['nic_gbps']}Gbps:infiniband",
                 intra_node_fabric="nvlink4", nccl_algo="Ring", gpu_preset=PEAK_GPU)
        net, ranks = network(s, extra)
        n = len(ranks)
        t = net.collective("allreduce", PEAK_BYTES, ranks).time()
        out.append(dict(nic_gbps=p["nic_gbps"], stated=p["busbw_GBps"],
                        predicted=busbw("allreduce", PEAK_BYTES, n, t) / 8 / 1e9))
    return out


def evaluate(doc: dict, extra: dict | None = None) -> tuple[list[dict], dict[str, dict]]:
    """(every row's prediction, per set and ``all`` its MAPE and mean signed error)."""
    rows, sets = [], {}
    for s in doc["sets"]:
        res = predict_set(s, doc["columns"], extra)
        rows += res
        sets[s["id"]] = summary(res)
    sets["all"] = summary(rows)
    return rows, sets


def reported(rows: list[dict], sets: dict[str, dict]) -> dict:
    """The figures ``--update`` stores and ``--check`` compares (rounded as printed)."""
    def r2(x):
        return None if x is None else round(x, 2)

    return dict(sets={k: dict(rows=v["rows"], mape_pct=r2(v["mape_pct"]),
                              mean_signed_pct=r2(v["mean_signed_pct"])) for k, v in sets.items()},
                predicted_us=[round(r["predicted_us"], 1) for r in rows])


def check(doc: dict, rows: list[dict], sets: dict[str, dict]) -> list[str]:
    """What differs between the recomputed figures and the file's ``reported`` block."""
    want, got = doc.get("reported"), reported(rows, sets)
    if not want:
        return ["the file has no 'reported' block (run --update)"]
    bad = []
    if set(want["sets"]) != set(got["sets"]):
        bad.append(f"sets {sorted(got['sets'])} != stored {sorted(want['sets'])}")
    for k in set(want["sets"]) & set(got["sets"]):
        w, g = want["sets"][k], got["sets"][k]
        for f in ("mape_pct", "mean_signed_pct"):
            if (w[f] is None) != (g[f] is None) or (w[f] is not None and abs(w[f] - g[f]) > TOLERANCE["pct"]):
                bad.append(f"{k} {f}: {g[f]} != stored {w[f]}")
        if w["rows"] != g["rows"]:
            bad.append(f"{k} rows: {g['rows']} != stored {w['rows']}")
    if len(want["predicted_us"]) != len(got["predicted_us"]):
        bad.append(f"{len(got['predicted_us'])} rows predicted, {len(want['predicted_us'])} stored")
    else:
        bad += [f"row {i}: predicted {g} us != stored {w}" for i, (w, g) in
                enumerate(zip(want["predicted_us"], got["predicted_us"])) if abs(w - g) > TOLERANCE["us"]]
    return bad


@contextlib.contextmanager
def nic_efficiency(kind: str, efficiency: float | None):
    """Predictions inside price NIC kind ``kind`` (:data:`perfsim.fabrics.NIC_KINDS`) at payload share
    ``efficiency`` (None: unchanged). An experiment of this script: the network reads the kind from
    that table, swapped here and restored; perfsim's own figure is not changed."""
    plain = NIC_KINDS[kind]
    if efficiency is not None:
        NIC_KINDS[kind] = dataclasses.replace(plain, efficiency=efficiency)
    try:
        yield
    finally:
        NIC_KINDS[kind] = plain


def _fmt(v: dict) -> str:
    if not v["rows"]:
        return "0 rows"
    return f"{v['rows']} rows, MAPE {v['mape_pct']:.1f} %, mean signed {v['mean_signed_pct']:+.1f} %"


def _print(results: dict[str, tuple[list[dict], dict[str, dict]]], peaks: list[dict], extra: dict) -> None:
    print("nccl-tests on multi-node clusters, perfsim's collective model"
          + (f" with {extra}" if extra else "") + "; error = (predicted - measured) / measured time")
    for role, (rows, sets) in results.items():
        print(f"-- {role}: {FILES[role].relative_to(ROOT)}")
        if rows:
            print(f"{'set':20} {'size':>11} {'meas us':>9} {'pred us':>9} {'err %':>7} {'busbw meas':>10} "
                  f"{'pred':>7}  algo")
        for r in rows:
            print(f"{r['set']:20} {r['size_bytes']:>11} {r['measured_us']:>9.1f} {r['predicted_us']:>9.1f} "
                  f"{r['error_pct']:>+7.1f} {r['measured_busbw']:>10.2f} {r['predicted_busbw']:>7.2f}  {r['algo']}")
        for k, v in sets.items():
            print(f"{role} {k}: {_fmt(v)}")
    print("stated per-NIC peaks (NCCL maintainers; outside the MAPE):")
    for p in peaks:
        print(f"  {p['nic_gbps']} Gb/s NIC: stated {p['stated']:.1f} GB/s, perfsim {p['predicted']:.1f} GB/s "
              f"({100 * (p['predicted'] - p['stated']) / p['stated']:+.1f} % busbw)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="an extra predict keyword (repeatable), e.g. collective_model=nccl")
    ap.add_argument("--mechanism", choices=sorted(MECHANISM), default=None,
                    help="NCCL's steps overlapped by their data (on: collective_model pipelined) or not "
                         "(off: nominal); default: predict's own default")
    ap.add_argument("--only", default=None, metavar="SET", help="only this set (its id in either file)")
    ap.add_argument("--ib-efficiency", type=float, default=None, metavar="SHARE",
                    help="price the infiniband NIC kind at this payload share (perfsim's: "
                         f"{NIC_KINDS['infiniband'].efficiency:g}; nic_efficiency)")
    ap.add_argument("--check", action="store_true",
                    help="compare with each file's 'reported' figures; exit 1 if they differ")
    ap.add_argument("--update", action="store_true", help="store the figures as each file's 'reported' block")
    args = ap.parse_args(argv)
    try:
        # values as text: predict's own parser reads them (perfsim.params.normalize); a name twice: refused
        extra = assignments(args.set)
    except ConfigError as exc:
        print(f"nccl_open_data: {exc}", file=sys.stderr)
        return 2
    if args.mechanism is not None:
        if "collective_model" in extra:
            print("nccl_open_data: --mechanism and --set collective_model: give one", file=sys.stderr)
            return 2
        extra["collective_model"] = MECHANISM[args.mechanism]
    if (extra or args.only or args.ib_efficiency is not None) and (args.check or args.update):
        print("nccl_open_data: --check and --update take the defaults (no --set, --mechanism, --only, "
              "--ib-efficiency)", file=sys.stderr)
        return 2
    docs = {role: load(path) for role, path in FILES.items()}
    if args.only is not None:
        ids = [s["id"] for d in docs.values() for s in d["sets"]]
        if args.only not in ids:
            print(f"nccl_open_data: --only {args.only!r}: no such set ({', '.join(ids)})", file=sys.stderr)
            return 2
        docs = {role: dict(d, sets=[s for s in d["sets"] if s["id"] == args.only]) for role, d in docs.items()}
    try:
        with nic_efficiency("infiniband", args.ib_efficiency):
            results = {role: evaluate(d, extra) for role, d in docs.items()}
            peaks = stated_peaks(docs["validation"], extra)
    except (ConfigError, ValueError) as exc:
        print(f"nccl_open_data: {exc}", file=sys.stderr)
        return 2
    if args.ib_efficiency is not None:
        extra = dict(extra, infiniband_efficiency=args.ib_efficiency)
    _print(results, peaks, extra)
    if args.update:
        for role, d in docs.items():
            d["reported"] = dict(command="python scripts/nccl_open_data.py", date=datetime.date.today().isoformat(),
                                 **reported(*results[role]))
            write_text(FILES[role], json_text(d) + "\n")
            print(f"stored in {FILES[role].relative_to(ROOT)} (reported)")
    if args.check:
        bad = [f"{role}: {b}" for role, d in docs.items() for b in check(d, *results[role])]
        print(f"check: {len(bad)} differ" + "".join(f"\n  {b}" for b in bad))
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
