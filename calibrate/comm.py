"""Point-to-point and collective time over the real torch.distributed backend.

``world_size`` ranks (2 by default) are started with torch.multiprocessing on
this machine -- gloo over TCP loopback on the CPU, NCCL on GPUs -- and time:

* ``p2p``: ping-pong, rank 0 sends ``size`` bytes to rank 1 which sends them
  back; one-way time = round trip / 2 (the classic ping-pong of NetPIPE and the
  OSU latency benchmark);
* ``messenger``: the same ping-pong through execute mode's own message path
  (:class:`perfsim.runtime.pipeline.Messenger`: one buffer of padded header +
  payload bytes, sent with ``isend``, its receive posted before the data
  arrives), recorded as ``p2p`` records named ``messenger`` -- the per-message
  cost a pipeline stage really pays;
* ``late``: a messenger message whose receive is posted ``LATE_S`` after it was
  sent (what a pipeline stage would pay if it did not post its receives ahead);
  time = the receive call alone. On gloo this is not free: a late receive can
  wait up to one kernel scheduler tick, while one posted before the data
  arrives completes at once (figures: docs/validation.md). Recorded as ``p2p``
  records named ``messenger-late``;
* ``framing``: the host time of execute mode's message path around one
  message, with the receive posted ahead as execute mode does: rank 0 times its
  ``send`` call (header, one buffer, ``isend``, which writes at once), rank 1
  its ``post`` plus a ``recv`` of data that has already arrived (unpacking).
  Caches are flushed before each timed call (:func:`perfsim.calibrate.timing.flush_caches`,
  as for codecs). Recorded as ``frame_send`` / ``frame_recv`` records named ``messenger``
  (``size_bytes`` = the payload's wire bytes); the simulator adds them to each
  pipeline message's encode and decode;
* ``allreduce`` (sum), ``allgather``, ``alltoall`` (``all_to_all_single``; skipped
  where the backend lacks it): every rank enters after a barrier, the time of a
  repeat is the slowest rank's (a collective is done when the last rank is);
* ``reduce_scatter`` (``reduce_scatter_tensor``) and ``allgather_tensor``
  (``all_gather_into_tensor``): the calls tensor parallelism issues (DTensor's
  functional collectives, :data:`perfsim.collectives.TENSOR_CALLS`), timed as
  tensor parallelism issues them: a train of :data:`TRAIN` calls back to back,
  every rank in step (time = train / ``TRAIN``), each repeat followed by a train
  of allreduces of the same buffer timed the same way. Recorded as
  ``reduce_scatter`` and ``allgather`` records whose ``call`` fact names the
  torch call and whose ``allreduce_s`` fact is that allreduce: the reference the
  simulator prices these kinds against (:func:`perfsim.collectives.measured`; a
  backend may implement a kind otherwise than its ring: gloo's reduce-scatter
  is an allreduce of the whole buffer). Back to back, an emulated link's token
  bucket stays drained as under tensor parallelism; one call after an idle gap
  may pass inside the burst or not, and near the burst size single calls
  scatter by 2x between sweeps.

* ``fsdp``: FSDP2's own host time per ``fully_shard`` unit and pass, in this
  process group (:mod:`perfsim.calibrate.fsdp_host`; records ``fsdp_host``).

``size_bytes`` is each rank's input buffer (fp32), as in
:class:`perfsim.compression.base.CommStep`. Sizes run from 1 KB to 256 MB by
factors of 4 (``--quick``: to 1 MB). Each size is repeated until ``repeats``
samples or ``max_seconds`` are reached (at least 3), after ``warmup`` calls.

Emulated links: with ``emulate_bandwidth`` the ranks run in network namespaces
joined by ``tc``-shaped veth links (:mod:`perfsim.netem`, the same emulation
``perfsim run --emulate-bandwidth`` uses), so the fits measure what the
simulator's nominal bandwidth turns into on the wire: TCP/IP framing, the
shaper's burst behaviour, gloo's per-message cost. The ratio of the fitted
bandwidth to the nominal one is the *protocol efficiency* at that speed.

Every (op, size) gives a record and each op an alpha-beta fit (``fit_<op>``;
:mod:`perfsim.calibrate.fit`).
"""

from __future__ import annotations

import math
import os
import statistics
import time
import traceback
from dataclasses import dataclass
from typing import Callable

from perfsim.calibrate.fit import fit_records
from perfsim.calibrate.profile_io import comm_name
from perfsim.errors import ConfigError

OPS = ("p2p", "allreduce", "allgather", "alltoall", "reduce_scatter", "allgather_tensor", "messenger", "late",
       "framing", "interference", "fsdp")
#: ops measured unless asked otherwise
DEFAULT_OPS = OPS
#: ops timing a torch call other than their kind's default: op -> (record op = kind, call)
CALL_OPS = {"reduce_scatter": ("reduce_scatter", "reduce_scatter_tensor"),
            "allgather_tensor": ("allgather", "all_gather_into_tensor")}
FULL_SIZES = tuple(1024 * 4**k for k in range(10))  # 1 KB .. 256 MB
QUICK_SIZES = tuple(1024 * 4**k for k in range(6))  # 1 KB .. 1 MB
LATE_S = 0.005
#: calls per timed train of a tensor-parallel kind (and of its allreduce reference)
TRAIN = 4
QUICK_EMULATED_SIZES = (1024, 4096, 65536, 1048576, 4194304, 16777216)


@dataclass(frozen=True)
class CommConfig:
    """What to measure.

    ops: subset of ``p2p, allreduce, allgather, alltoall``.
    sizes: per-rank buffer sizes in bytes (multiples of 4).
    world_size: ranks (>= 2).
    backend: ``gloo`` or ``nccl`` (None: nccl with >= world_size GPUs, else gloo).
    emulate_bandwidth: bits/s of an emulated link between the ranks (None: loopback).
    emulate_latency: one-way delay in seconds added by the emulated link.
    max_call_s: sizes whose one call would take longer than this at the emulated
      bandwidth are skipped (keeps a 100 Mbps sweep from running for minutes).
    threads: torch threads per rank.
    small_repeats: repeats of messages up to ``small_bytes`` (0: ``repeats``). Their
      time is bimodal (~0.1 ms, or a wait for a 4-ms kernel tick), so the mean the
      simulator uses as the per-message fixed cost needs more samples; they are cheap.
      Over an emulated link every call up to its token-bucket depth gets them too
      (:func:`perfsim.shaping.tbf_burst_bytes`, 500 KB at 1 Gbps): how full the bucket is
      decides such a call's time, and 15 repeats of a 256 KiB all-reduce at 1 Gbps gave a
      median of 1.3 to 3.1 ms across five calibrations, 60 repeats 1.98 to 2.03 ms
      (docs/validation.md, "Each schedule timed in situ").
    framing_cold: flush the caches before each timed ``framing`` call (as after a
      training step); False times it hot (``benchmarks/bench_messenger.py``).
    interference_rounds: alternating (alone, busy) windows of the ``interference`` op
      (None: :data:`perfsim.calibrate.interference.ROUNDS`; the tests take fewer).
    """

    ops: tuple[str, ...] = DEFAULT_OPS
    sizes: tuple[int, ...] = FULL_SIZES
    world_size: int = 2
    backend: str | None = None
    warmup: int = 2
    repeats: int = 7
    max_seconds: float = 3.0
    emulate_bandwidth: float | None = None
    emulate_latency: float = 0.0
    max_call_s: float = 4.0
    threads: int = 1
    timeout_s: float = 600.0
    framing_cold: bool = True
    small_repeats: int = 0
    small_bytes: int = 65536
    interference_rounds: int | None = None

    def __post_init__(self):
        bad = [o for o in self.ops if o not in OPS]
        if bad or not self.ops:
            raise ConfigError(f"comm ops {bad or self.ops}: choose from {', '.join(OPS)}")
        if not self.sizes or any(int(s) < 4 or int(s) % 4 for s in self.sizes):
            raise ConfigError(f"comm sizes {self.sizes}: need multiples of 4 bytes, >= 4")
        if self.small_repeats < 0 or self.small_bytes < 0:
            raise ConfigError(f"small_repeats={self.small_repeats}, small_bytes={self.small_bytes}: must be >= 0")
        if self.world_size < 2:
            raise ConfigError(f"world_size={self.world_size}: comm calibration needs >= 2 ranks")
        if self.backend not in (None, "gloo", "nccl"):
            raise ConfigError(f"backend={self.backend!r}: use gloo or nccl")
        if self.emulate_bandwidth is not None and not self.emulate_bandwidth > 0:
            raise ConfigError(f"emulate_bandwidth={self.emulate_bandwidth}: must be > 0 bits/s")
        if self.emulate_latency < 0:
            raise ConfigError(f"emulate_latency={self.emulate_latency}: must be >= 0")
        if self.repeats < 1 or self.warmup < 0 or self.threads < 1:
            raise ConfigError("comm repeats >= 1, warmup >= 0, threads >= 1 required")
        if self.interference_rounds is not None and self.interference_rounds < 1:
            raise ConfigError(f"interference_rounds={self.interference_rounds}: must be >= 1")

    def resolved_backend(self) -> str:
        if self.backend:
            return self.backend
        import torch

        return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= self.world_size else "gloo"

    def sizes_to_run(self) -> list[int]:
        """Sizes, minus those too slow for the emulated link (``max_call_s``)."""
        sizes = sorted(int(s) for s in self.sizes)
        if self.emulate_bandwidth is None:
            return sizes
        keep = [s for s in sizes if 8 * s / self.emulate_bandwidth <= self.max_call_s]
        return keep or sizes[:1]


def _n_repeats(dist, first_call_s: float, cfg: CommConfig, device, size: int = 0) -> int:
    """Rank 0 decides how many repeats fit into ``max_seconds``; all ranks agree."""
    import torch

    small = cfg.small_bytes
    if cfg.emulate_bandwidth:  # a call that fits in the link's token bucket is bimodal too
        from perfsim.shaping import tbf_burst_bytes

        small = max(small, tbf_burst_bytes(cfg.emulate_bandwidth))
    want = cfg.small_repeats if cfg.small_repeats and size <= small else cfg.repeats
    n = want if first_call_s <= 0 else int(cfg.max_seconds / first_call_s)
    t = torch.tensor([max(3, min(want, n))], dtype=torch.int64, device=device)
    dist.broadcast(t, src=0)
    return int(t.item())


def _messenger_payload(device, n: int):
    """Execute mode's Messenger and an ``n``-float payload of 8 sample rows (as a
    micro-batch of 8; 1 row when ``n`` does not split), with its sample ids."""
    import torch

    from perfsim.compression.base import Payload
    from perfsim.runtime import Messenger, header_capacity

    rows = 8 if n % 8 == 0 else 1
    payload = Payload({"values": torch.ones(n, device=device).view(rows, n // rows)}, (rows, n // rows))
    return Messenger(device, header_capacity(rows)), payload, torch.arange(rows)


def _run_ops(rank: int, cfg: CommConfig, backend: str) -> list[dict]:
    """Body of one rank: time every op and size; returns this rank's raw samples."""
    import torch
    import torch.distributed as dist

    device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
    world = cfg.world_size

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def train(collective, output, input_):
        """TRAIN calls of ``collective(output, input_)`` back to back, as tensor parallelism issues them."""
        def call():
            for _ in range(TRAIN):
                collective(output, input_)
            sync()
        return call

    out = []
    for op in cfg.ops:
        if op == "interference":  # compute alone vs under allreduces (perfsim.calibrate.interference)
            from perfsim.calibrate.interference import measure

            out.extend(measure(rank, device, world, backend, cfg.emulate_bandwidth, cfg.interference_rounds))
            continue
        if op == "fsdp":  # FSDP2's own host time per unit (perfsim.calibrate.fsdp_host)
            from perfsim.calibrate import fsdp_host

            out.extend(fsdp_host.measure(rank, device, world, repeats=cfg.repeats))
            continue
        for size in cfg.sizes_to_run():
            n = size // 4
            if op == "late":
                msg, payload, ids = _messenger_payload(device, n)
                box = {}

                def call():
                    if rank == 0:
                        msg.send(payload, ids, 1)
                        msg.wait_all()
                    elif rank == 1:
                        time.sleep(LATE_S)
                        t = time.perf_counter()
                        msg.recv(0, payload.nbytes)
                        box["t"] = time.perf_counter() - t
                    dist.barrier()
                scale = None  # the sample is the receive call alone (rank 1)
            elif op == "framing":
                from perfsim.calibrate.timing import flush_caches

                msg, payload, ids = _messenger_payload(device, n)
                settle_s = 0.002 + size / 1e9  # the data has arrived (loopback moves GB/s)
                box = {}

                def call():
                    posted_s = 0.0
                    if rank == 1 and 0 in msg.shapes:  # after the link's first message
                        t = time.perf_counter()
                        msg.post(0, payload.nbytes)
                        posted_s = time.perf_counter() - t
                    dist.barrier()  # the receive is posted before the send
                    if rank == 0:
                        if cfg.framing_cold:
                            flush_caches(str(device))  # as after the forward/backward before it
                        t = time.perf_counter()
                        msg.send(payload, ids, 1)
                        box["t"] = time.perf_counter() - t
                        msg.wait_all()
                    elif rank == 1:
                        time.sleep(settle_s)
                        if cfg.framing_cold:
                            flush_caches(str(device))
                        t = time.perf_counter()
                        msg.recv(0, payload.nbytes)
                        box["t"] = posted_s + time.perf_counter() - t
                    dist.barrier()
                scale = None  # each rank's own host time
            elif op == "messenger":
                msg, payload, ids = _messenger_payload(device, n)

                def call():
                    if rank == 0:
                        msg.send(payload, ids, 1)
                        msg.recv(1, payload.nbytes)
                    elif rank == 1:
                        msg.recv(0, payload.nbytes)
                        msg.send(payload, ids, 0)
                    msg.wait_all()
                    sync()
                scale = 0.5
            elif op == "p2p":
                buf = torch.ones(n, device=device)

                def call():
                    if rank == 0:
                        dist.send(buf, 1)
                        dist.recv(buf, 1)
                    elif rank == 1:
                        dist.recv(buf, 0)
                        dist.send(buf, 0)
                    sync()
                scale = 0.5  # one way
            elif op == "allreduce":
                buf = torch.ones(n, device=device)

                def call():
                    dist.all_reduce(buf)
                    sync()
                scale = 1.0
            elif op == "allgather":
                buf = torch.ones(n, device=device)
                parts = [torch.empty_like(buf) for _ in range(world)]

                def call():
                    dist.all_gather(parts, buf)
                    sync()
                scale = 1.0
            elif op == "reduce_scatter":  # each rank's whole input is `size`, its output 1/world
                m = max(world, n - n % world)
                src, dst = torch.ones(m, device=device), torch.empty(m // world, device=device)
                # the backend's _reduce_scatter_base, as the functional op (newer torch renames the API)
                reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
                call, ref_buf, scale = train(reduce_scatter, dst, src), torch.ones(m, device=device), 1.0 / TRAIN
            elif op == "allgather_tensor":  # each rank contributes `size`
                buf = torch.ones(n, device=device)
                whole = torch.empty(n * world, device=device)
                all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
                call, ref_buf, scale = train(all_gather, whole, buf), torch.ones(n, device=device), 1.0 / TRAIN
            else:  # alltoall: each rank's whole send buffer is `size`
                m = max(world, n - n % world)
                src, dst = torch.ones(m, device=device), torch.empty(m, device=device)

                def call():
                    dist.all_to_all_single(dst, src)
                    sync()
                scale = 1.0
            try:
                dist.barrier()
                t0 = time.perf_counter()
                call()
                first = time.perf_counter() - t0
            except RuntimeError as exc:  # backend lacks the op (e.g. alltoall)
                out.append({"op": op, "skipped": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"})
                break
            for _ in range(max(0, cfg.warmup - 1)):
                call()
            reps = _n_repeats(dist, first * (2 if op in CALL_OPS else 1), cfg, device, size)
            samples, ref_samples = [], []
            for _ in range(reps):
                dist.barrier()
                t0 = time.perf_counter()
                call()
                if scale is None:
                    samples.append(box.get("t", 0.0))
                else:
                    samples.append((time.perf_counter() - t0) * scale)
                if op in CALL_OPS:  # the reference: a train of allreduces of the same buffer
                    dist.barrier()
                    t0 = time.perf_counter()
                    for _ in range(TRAIN):
                        dist.all_reduce(ref_buf)
                    sync()
                    ref_samples.append((time.perf_counter() - t0) / TRAIN)
            out.append({"op": op, "size_bytes": m * 4 if op in ("alltoall", "reduce_scatter") else size,
                        "samples": samples, **({"ref_samples": ref_samples} if ref_samples else {})})
    return out


def _worker(rank: int, cfg: CommConfig, backend: str, addr: str, ports, queue,
            netns: str | None) -> None:  # pragma: no cover - runs in a subprocess
    """One rank. Rank 0 serves the rendezvous store on a port the kernel picks as it binds
    and hands it to the others through ``ports`` (:func:`perfsim.rank_store.handoff`: a port
    found free and released before the store binds it could be taken in between, and the
    ranks would then meet a stranger: "Connection reset by peer", then a timeout).

    Puts exactly one message on ``queue`` -- its records, or its traceback -- once its process
    group is torn down (on success after a barrier: no rank tears gloo down while a peer is
    still in the last collective), then leaves without interpreter finalization
    (:func:`perfsim.procs.exit_rank`; gloo's threads can otherwise abort a finished rank with
    "terminate called without an active exception")."""
    code = 1
    try:
        import torch
        import torch.distributed as dist

        from perfsim import rank_store  # lazy: a spawned rank imports what it needs

        if netns:
            from perfsim.calibrate.netlink import enter_namespace

            enter_namespace(netns)
        torch.set_num_threads(cfg.threads)
        if backend == "nccl":
            torch.cuda.set_device(rank)
        store = rank_store.handoff(rank, cfg.world_size, cfg.timeout_s, addr, ports)
        rank_store.init_group(backend, rank, cfg.world_size, cfg.timeout_s, store)
        try:
            records = _run_ops(rank, cfg, backend)
            dist.barrier()
        finally:
            dist.destroy_process_group()
        queue.put((rank, records, None))
        code = 0
    except BaseException:  # noqa: BLE001 - report to the parent, never hang it
        queue.put((rank, None, traceback.format_exc()))
    finally:
        from perfsim.procs import exit_rank  # lazy: as the imports above

        exit_rank(code)


def _summarize(per_rank: dict[int, list[dict]], cfg: CommConfig, backend: str) -> list[dict]:
    from perfsim.calibrate.timing import summarize

    records = []
    rank0 = per_rank[0]
    for i, item in enumerate(rank0):
        if "skipped" in item:
            records.append({"op": item["op"], "skipped": item["skipped"]})
            continue
        if item["op"] == "interference":  # compute alone / under comm: the mean over ranks of
            # each rank's statistic -- the host's share of the traffic (softirqs, wakeups) lands
            # on one core or the other, so one rank may see most of the slowdown
            ranks = [summarize(per_rank[r][i]["samples"]) for r in sorted(per_rank)]
            t = summarize([x for r in ranks for x in r.samples])
            rec = {"op": "interference", "name": item["name"], "size_bytes": item["size_bytes"],
                   "world_size": cfg.world_size, "dtype": "float32", **t.record(),
                   "time_s": statistics.fmean(r.record()["time_s"] for r in ranks)}
            if cfg.emulate_bandwidth is not None:  # under traffic over the emulated link
                rec["emulated_bandwidth_bps"] = cfg.emulate_bandwidth
                rec["emulated_latency_s"] = cfg.emulate_latency
            records.append(rec)
            continue
        if item["op"] == "fsdp":  # FSDP2's host time per unit and root, forward and backward
            from perfsim.calibrate.fsdp_host import record

            records.append(record([per_rank[r][i] for r in sorted(per_rank)], cfg.world_size, cfg.threads))
            continue
        if item["op"] == "framing":  # host time: rank 0 sends, rank 1 receives
            for side, r in (("send", 0), ("recv", 1)):
                t = summarize(per_rank[r][i]["samples"])
                records.append({"op": f"frame_{side}", "name": "messenger", "size_bytes": item["size_bytes"],
                                "world_size": 2, "dtype": "uint8", **t.record()})
            continue
        # a repeat of a collective takes as long as its slowest rank
        p2p = item["op"] in ("p2p", "messenger", "late")
        timing_rank = 1 if item["op"] == "late" else 0
        ranks = [per_rank[r][i]["samples"] for r in sorted(per_rank) if not p2p or r == timing_rank]
        samples = [max(vals) for vals in zip(*ranks)]
        t = summarize(samples)
        base = {"messenger": "messenger", "late": "messenger-late"}.get(item["op"], backend)
        name = comm_name(base, cfg.emulate_bandwidth)
        kind, call = CALL_OPS.get(item["op"], ("p2p" if p2p else item["op"], None))
        rec = {"op": kind, "name": name, **({"call": call} if call else {}),
               "size_bytes": item["size_bytes"], "world_size": 2 if p2p else cfg.world_size, "dtype": "float32",
               **t.record(),
               # the expected cost: small messages are bimodal (~0.1 ms, or a wait for the
               # next 4-ms kernel tick), a median lands on either mode; a run pays the mean
               "mean_s": sum(samples) / len(samples)}
        if "ref_samples" in item:  # its allreduce reference (same statistic), the slowest rank's per repeat
            rec["allreduce_s"] = summarize([max(v) for v in zip(*(per_rank[r][i]["ref_samples"]
                                                                  for r in sorted(per_rank)))]).record()["time_s"]
        if item["op"] == "late":
            # the late-receive cost depends on the kernel tick's phase, not on interference:
            # always the median (a minimum would report the lucky case)
            rec["time_s"] = t.median_s
        if cfg.emulate_bandwidth is not None:
            rec["emulated_bandwidth_bps"] = cfg.emulate_bandwidth
            rec["emulated_latency_s"] = cfg.emulate_latency
        records.append(rec)
    return records


def measure_comm(cfg: CommConfig, progress: Callable[[str], None] | None = None) -> list[dict]:
    """Run the ranks, collect raw records and ``fit_<op>`` records.

    Returns records; skipped ops come back as ``{"op": ..., "skipped": why}``
    entries (the caller reports and drops them).
    """
    import torch.multiprocessing as mp

    backend = cfg.resolved_backend()
    if backend == "nccl":
        import torch

        if torch.cuda.device_count() < cfg.world_size:
            raise ConfigError(f"backend nccl: {cfg.world_size} ranks need {cfg.world_size} GPUs, "
                              f"found {torch.cuda.device_count()}")
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    namespaces = None
    addr = "127.0.0.1"
    if cfg.emulate_bandwidth is not None:
        from perfsim.calibrate.netlink import emulated_ranks

        namespaces = emulated_ranks(cfg.world_size, cfg.emulate_bandwidth, cfg.emulate_latency)
    try:
        nsnames = [None] * cfg.world_size
        if namespaces is not None:
            nsnames, addrs = namespaces.__enter__()
            addr = addrs[0]
        ports = ctx.Queue()
        what = f"{backend} x{cfg.world_size}" + (
            f" @ {cfg.emulate_bandwidth / 1e6:g} Mbps" if cfg.emulate_bandwidth else " loopback")
        if progress:
            progress(f"comm {', '.join(cfg.ops)} {what}")
        procs = [ctx.Process(target=_worker, args=(r, cfg, backend, addr, ports, queue, nsnames[r]),
                             daemon=True) for r in range(cfg.world_size)]
        for p in procs:
            p.start()
        per_rank: dict[int, list[dict]] = {}
        errors = []
        deadline = time.monotonic() + cfg.timeout_s
        try:
            while len(per_rank) + len(errors) < cfg.world_size:
                if time.monotonic() > deadline:
                    raise ConfigError(f"comm calibration ({what}): timed out after {cfg.timeout_s:.0f} s")
                if queue.empty():
                    if any(not p.is_alive() and p.exitcode not in (0, None) for p in procs):
                        time.sleep(0.5)
                        if queue.empty():
                            codes = [p.exitcode for p in procs]
                            raise ConfigError(f"comm calibration ({what}): a rank died (exit codes {codes})")
                    time.sleep(0.05)
                    continue
                rank, result, err = queue.get()
                if err:
                    errors.append((rank, err))
                else:
                    per_rank[rank] = result
        finally:
            for p in procs:
                p.join(timeout=5)
                if p.is_alive():
                    p.terminate()
                    p.join(timeout=5)
        if errors:
            rank, err = errors[0]
            last = err.strip().splitlines()[-1]
            raise ConfigError(f"comm calibration ({what}): rank {rank} failed: {last}")
    finally:
        if namespaces is not None:
            namespaces.__exit__(None, None, None)
    records = _summarize(per_rank, cfg, backend)
    raw = [r for r in records if "skipped" not in r]
    kinds = {"messenger": ["p2p"], "late": ["p2p"], "framing": ["frame_send", "frame_recv"], "interference": [], "fsdp": [],
             **{o: [kind] for o, (kind, _) in CALL_OPS.items()}}
    for op in sorted({k for o in cfg.ops for k in kinds.get(o, [o])}):
        # one fit per backend/link and torch call (an allgather of tensors is not a list's)
        records += [{k: v for k, v in r.items() if v is not None}
                    for r in fit_records(raw, op, ("name", "call"))]
    return records


def efficiency(fit_bandwidth_Bps: float | None, nominal_bps: float) -> float | None:
    """Protocol efficiency: fitted bytes/s x 8 over the nominal bits/s."""
    if not fit_bandwidth_Bps or not nominal_bps or not math.isfinite(fit_bandwidth_Bps):
        return None
    return 8.0 * fit_bandwidth_Bps / nominal_bps


def default_threads() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // 2)
