"""Execute the schedule tables of :mod:`perfsim.schedules` on one stage rank.

Each rank runs ``table[stage]`` (GPipe or 1F1B) action by action. A forward on
stage ``s > 0`` first receives micro-batch ``mb``'s activation from ``s-1``; a
forward on ``s < p-1`` then compresses its output with the forward compressor
and sends it to ``s+1``. A backward mirrors this with activation gradients and
the backward compressor (aq-sgd-paper.txt Sec. 3: AQ-SGD compresses forward
activations by their change against a per-sample message buffer, backward
gradients are directly quantized).

Wire protocol (torch.distributed p2p, gloo on CPU / NCCL on GPU). A message is
one uint8 buffer = pickled *header* ++ *body*, where the body is the payload
tensors' raw bytes (``Payload.tensors``: packed codes + scales, exactly
``Payload.nbytes``) and the header carries the tensors' names/dtypes/shapes,
the payload meta, the micro-batch's **sample ids** (AQ-SGD keys travel with the
data) and the sender's ``perf_counter`` at send time.

* The first message on a link describes itself: ``sizes`` int64[2] = (header
  bytes, body bytes) with tag 0, then the buffer with tag 1. The receiver
  learns the payload shape from it.
* Every later message is the buffer alone (tag 2), its header zero-padded to a
  fixed ``header_bytes``. Its size is known to the receiver beforehand (its own
  compressor's :meth:`~perfsim.compression.base.Compressor.payload_nbytes` for
  the learned shape and the micro-batch's ids), so on gloo each stage **posts
  its receives ahead** (``irecv``, a step in advance) as pipeline runtimes with
  known tensor shapes do. gloo's p2p is receiver-driven: a send moves only once
  the receive is posted, and a receive posted late must wake the sender's gloo
  thread while the sender computes -- on a 2-core machine that cost 3-10 ms per
  message (``traces/measured/late_receive_busy_sender.py``; with the receive
  posted ahead: 0.01-0.4 ms). NCCL orders p2p operations on one stream per
  peer pair, so there a receive is posted when it is needed.

Sends are non-blocking (``isend``; awaited at the end of the step, so 1F1B's
crossing sends cannot deadlock). On one machine (also across network
namespaces) ``perf_counter`` is the shared CLOCK_MONOTONIC, so the receiver
splits its blocked time into *waiting* for the sender (idle) and *transfer*
(``done - max(sent, started waiting)``, the comm time).

Stage-to-stage compressors are separate objects on each side of a boundary:
the sender's ``fw_send`` and the receiver's ``fw_recv`` (and ``bw_send`` /
``bw_recv``). For AQ-SGD both keep the per-sample message buffers, which stay
identical because both apply the same decoded deltas (checked by the tests).
"""

from __future__ import annotations

import os
import pickle
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from perfsim.compression.base import Payload
from perfsim.schedules import BACKWARD, FORWARD, Action

TAG_SIZES, TAG_BODY, TAG_MESSAGE = 0, 1, 2
_DTYPES = {str(d): d for d in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                               torch.float16, torch.bfloat16, torch.float32, torch.float64,
                               torch.bool)}


# ---------------------------------------------------------------- messaging
def header_capacity(ids_per_message: int) -> int:
    """Bytes reserved for the padded header of a message carrying that many sample
    ids (a pickled header with 8 ids and an AQ-SGD payload is ~330 bytes)."""
    return 512 + 16 * int(ids_per_message)


@dataclass
class RecvInfo:
    """Timing of one received message (seconds, perf_counter clock); ``posted`` is
    when the receiver started waiting for it (its receive may be posted earlier)."""

    posted: float
    sent: float
    done: float
    body_bytes: int
    header_bytes: int

    unpack_s: float = 0.0  # host time after the data was in: parsing the header, views

    @property
    def transfer_s(self) -> float:
        start = max(self.sent, self.posted)
        return max(0.0, min(self.done - start, self.done - self.posted))

    @property
    def wait_s(self) -> float:
        return max(0.0, self.done - self.posted - self.transfer_s)


class Messenger:
    """Sends and receives payloads between ranks (module docstring: wire protocol);
    keeps pending isends and posted irecvs alive.

    ``header_bytes``: the fixed header size of every message after a link's first
    (both ends must agree; :func:`header_capacity`).
    """

    def __init__(self, device: torch.device, header_bytes: int = header_capacity(64)):
        self.device = device
        self.header_bytes = int(header_bytes)
        self.pending: list[tuple[Any, list[torch.Tensor]]] = []
        self.described: set[int] = set()  # peers that received their self-describing first message
        self.shapes: dict[int, tuple[int, ...]] = {}  # src -> payload shape learned from it
        self.posted: dict[int, deque] = defaultdict(deque)  # src -> posted (work, buffer), in order
        # one-way latency added here when the kernel cannot (see perfsim.netem)
        self.app_latency_s = float(os.environ.get("PERFSIM_APP_LATENCY_S", "0") or 0)
        self.app_bandwidth_bps = float(os.environ.get("PERFSIM_APP_BANDWIDTH_BPS", "0") or 0)

    def _add_latency(self, posted: float, sent: float, done: float, nbytes: int) -> float:
        """Deliver a message ``app_latency_s`` after its last byte arrived.

        Arrival is when ``recv`` returned if the receiver was already waiting
        before the data could have arrived (``sent + nbytes*8/bandwidth``);
        otherwise the message was buffered and that earliest possible arrival is
        used (messages in flight overlap their latency, as on a real link).
        """
        earliest = sent + nbytes * 8 / self.app_bandwidth_bps if self.app_bandwidth_bps else sent
        arrival = done if posted <= earliest else max(earliest, min(done, posted))
        target = arrival + self.app_latency_s
        now = time.perf_counter()
        if target > now:
            time.sleep(target - now)
        return max(time.perf_counter(), done)

    def send(self, payload: Payload, ids: torch.Tensor, dst: int) -> tuple[int, int]:
        """Start sending ``payload`` + ``ids`` to global rank ``dst``.
        Returns (body bytes, header (+ sizes) bytes)."""
        names = list(payload.tensors)
        flat = [payload.tensors[n].detach().contiguous().reshape(-1) for n in names]
        header = {
            "names": names,
            "dtypes": [str(t.dtype) for t in flat],
            "shapes": [tuple(payload.tensors[n].shape) for n in names],
            "numels": [t.numel() for t in flat],
            "shape": tuple(payload.shape), "dtype": str(payload.dtype),
            "meta": payload.meta, "ids": ids.tolist(), "sent": time.perf_counter(),
        }
        hbytes = pickle.dumps(header, protocol=pickle.HIGHEST_PROTOCOL)
        first = dst not in self.described
        if not first:
            if len(hbytes) > self.header_bytes:
                raise RuntimeError(f"message to rank {dst}: header of {len(hbytes)} bytes exceeds the "
                                   f"{self.header_bytes} reserved (ids={len(header['ids'])})")
            hbytes += bytes(self.header_bytes - len(hbytes))
        parts = [torch.frombuffer(bytearray(hbytes), dtype=torch.uint8).to(self.device)]
        parts += [t.view(torch.uint8) for t in flat if t.numel()]
        buf = torch.cat(parts) if len(parts) > 1 else parts[0]
        body = buf.numel() - len(hbytes)
        if first:
            sizes = torch.tensor([len(hbytes), body], dtype=torch.int64, device=self.device)
            self.pending.append((dist.isend(sizes, dst, tag=TAG_SIZES), [sizes]))
            self.pending.append((dist.isend(buf, dst, tag=TAG_BODY), [buf]))
            self.described.add(dst)
            return body, len(hbytes) + 16
        self.pending.append((dist.isend(buf, dst, tag=TAG_MESSAGE), [buf]))
        return body, len(hbytes)

    def post(self, src: int, body_nbytes: int) -> None:
        """Post the receive of the next message from ``src`` (not a link's first),
        whose body is ``body_nbytes``; :meth:`recv` consumes posted receives in order."""
        buf = torch.empty(self.header_bytes + int(body_nbytes), dtype=torch.uint8, device=self.device)
        self.posted[src].append((dist.irecv(buf, src, tag=TAG_MESSAGE), buf))

    def recv(self, src: int, body_nbytes: int | None = None) -> tuple[Payload, torch.Tensor, RecvInfo]:
        """Receive the next message from ``src``: the oldest posted receive, else one
        posted now (``body_nbytes`` needed once the link's first message is in)."""
        posted = time.perf_counter()
        if src in self.shapes:
            if not self.posted[src]:
                if body_nbytes is None:
                    raise RuntimeError(f"receive from rank {src}: nothing posted and no expected size")
                self.post(src, body_nbytes)
            work, buf = self.posted[src].popleft()
            work.wait()
            hlen, framing = self.header_bytes, self.header_bytes
        else:  # the link's first message describes itself
            sizes = torch.empty(2, dtype=torch.int64, device=self.device)
            dist.recv(sizes, src, tag=TAG_SIZES)
            hlen, blen = (int(v) for v in sizes.tolist())
            buf = torch.empty(hlen + blen, dtype=torch.uint8, device=self.device)
            dist.recv(buf, src, tag=TAG_BODY)
            framing = hlen + 16
        done = time.perf_counter()
        blen = buf.numel() - hlen
        header = pickle.loads(buf[:hlen].cpu().numpy().tobytes())  # stops before the padding
        self.shapes[src] = tuple(header["shape"])
        unpack_s = time.perf_counter() - done
        if self.app_latency_s:
            done = self._add_latency(posted, header["sent"], done, blen + framing)
        t_views = time.perf_counter()
        tensors, off = {}, hlen
        for name, dt, shape, n in zip(header["names"], header["dtypes"], header["shapes"],
                                      header["numels"]):
            dtype = _DTYPES[dt]
            nbytes = n * dtype.itemsize
            # a view into this message's own buffer (fresh per message) where aligned
            seg = buf[off:off + nbytes]
            tensors[name] = (seg if off % dtype.itemsize == 0 else seg.clone()).view(dtype).reshape(shape)
            off += nbytes
        if off != buf.numel():
            raise RuntimeError(f"message from rank {src}: {buf.numel() - hlen} body bytes posted, "
                               f"{off - hlen} sent (sender and receiver compressors out of step)")
        payload = Payload(tensors, tuple(header["shape"]), _DTYPES[header["dtype"]], header["meta"])
        ids = torch.tensor(header["ids"], dtype=torch.int64)
        unpack_s += time.perf_counter() - t_views
        return payload, ids, RecvInfo(posted, header["sent"], done, blen, framing, unpack_s)

    def wait_all(self) -> float:
        """Wait for every pending send; returns the seconds spent waiting."""
        t0 = time.perf_counter()
        for work, _ in self.pending:
            work.wait()
        self.pending.clear()
        return time.perf_counter() - t0


# ---------------------------------------------------------------- one stage
@dataclass
class MicroRecord:
    """Per micro-batch timings of one stage in one step (seconds / bytes)."""

    fwd_compute_s: float = 0.0
    bwd_compute_s: float = 0.0
    fwd_comm_s: float = 0.0  # transfer of the incoming activation
    fwd_wait_s: float = 0.0  # blocked before the activation started arriving
    fwd_span_s: float = 0.0  # sender's send start -> received (upper bound of the transfer)
    bwd_comm_s: float = 0.0
    bwd_wait_s: float = 0.0
    bwd_span_s: float = 0.0
    encode_s: float = 0.0  # encode + decode on this stage, with the message framing (send, unpack)
    bytes_sent: int = 0  # wire bytes (payload bodies)
    overhead_bytes: int = 0  # headers (sizes, dtypes, sample ids, timestamp)


@dataclass
class StepRecord:
    step: int
    epoch: int
    start: float
    end: float
    loss: float | None
    micro: list[MicroRecord]
    send_wait_s: float = 0.0
    pipe_end: float = 0.0  # when this stage's last action finished
    dp_sync_s: float = 0.0
    dp_warmup: bool = False  # a 1-bit optimizer's uncompressed warm-up step
    dp_bytes: int = 0
    optimizer_s: float = 0.0
    tp_comm_s: float = 0.0  # tensor-parallel collectives (perfsim.runtime.tensor_parallel)
    tp_bytes: int = 0
    tp_ops: dict[str, int] = field(default_factory=dict)  # collective kind -> count
    links: dict[int, list[float]] = field(default_factory=dict)  # dst -> [bytes, busy_s]
    events: list[tuple] = field(default_factory=list)  # (name, cat, t0, t1, args)


class StageRunner:
    """Runs one stage's schedule actions for a step.

    module: the :class:`perfsim.runtime.models.Stage`; actions: ``table[stage]``;
    prev_rank / next_rank: global ranks of the neighbouring stages (None at the ends);
    compressors: dict with ``fw_send``, ``fw_recv``, ``bw_send``, ``bw_recv``.
    dataset: to load inputs (first stage) and targets (last stage) by sample id.
    """

    def __init__(self, module, actions: list[Action], prev_rank, next_rank, compressors,
                 dataset, micro_batch: int, device: torch.device, trace: bool = True):
        self.module = module
        self.actions = actions
        self.prev_rank, self.next_rank = prev_rank, next_rank
        self.comp = compressors
        self.dataset = dataset
        self.micro_batch = micro_batch
        self.device = device
        self.msg = Messenger(device, header_capacity(micro_batch))
        self.trace = trace
        self.num_microbatches = 1 + max(a.microbatch for a in actions)
        # receives are posted ahead on gloo only (module docstring)
        self.post_ahead = dist.is_initialized() and dist.get_backend() == "gloo"
        self._posted: dict[int, int] = {}  # peer -> receives of the coming step already posted
        # the order this stage consumes (= the peer sends) each direction's micro-batches
        self._order = {"fw_recv": [a.microbatch for a in actions if a.kind == FORWARD],
                       "bw_recv": [a.microbatch for a in actions if a.kind == BACKWARD]}
        self._step_ids: list[torch.Tensor] = []

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _now(self) -> float:
        self._sync()
        return time.perf_counter()

    def _event(self, rec: StepRecord, name, cat, t0, t1, **args):
        if self.trace:
            rec.events.append((name, cat, t0, t1, args))

    def _split(self, step: int, ids: torch.Tensor) -> list[torch.Tensor]:
        mb_ids = list(ids.split(self.micro_batch))
        if len(mb_ids) != self.num_microbatches:
            raise RuntimeError(f"step {step}: {len(ids)} ids do not make {self.num_microbatches} micro-batches")
        return mb_ids

    def _inbound(self):
        """(peer, receiving compressor slot) of each link this stage receives on."""
        return [(p, slot) for p, slot in ((self.prev_rank, "fw_recv"), (self.next_rank, "bw_recv"))
                if p is not None]

    def post_receives(self, mb_ids: list[torch.Tensor]) -> None:
        """Post the receives of a step's micro-batches (``mb_ids``) that are not posted
        yet, on every link whose first message has arrived (gloo only). Each size is
        the receiving compressor's ``payload_nbytes`` for the learned shape and ids:
        AQ-SGD's first visits travel in full, and sender and receiver store the same ids."""
        if not self.post_ahead:
            return
        for peer, slot in self._inbound():
            shape = self.msg.shapes.get(peer)
            if shape is None:
                continue
            order = self._order[slot]
            for mb in order[self._posted.get(peer, 0):]:
                self.msg.post(peer, self.comp[slot].payload_nbytes(shape, key=mb_ids[mb]))
            self._posted[peer] = len(order)

    def run_step(self, step: int, epoch: int, ids: torch.Tensor,
                 next_ids: torch.Tensor | None = None) -> StepRecord:
        """Run every action of this stage for one step (no optimizer). ``next_ids``:
        the next step's samples, whose receives are posted as this step ends."""
        m = self.num_microbatches
        mb_ids = self._step_ids = self._split(step, ids)
        self.post_receives(mb_ids)
        rec = StepRecord(step, epoch, self._now(), 0.0, None, [MicroRecord() for _ in range(m)])
        live: dict[int, tuple] = {}
        losses: list[float] = []
        for action in self.actions:
            if action.kind == FORWARD:
                live[action.microbatch] = self._forward(action.microbatch, mb_ids, rec, losses)
            else:
                self._backward(action.microbatch, live.pop(action.microbatch), rec)
        rec.pipe_end = self._now()
        self._posted = {}
        if next_ids is not None:
            self.post_receives(self._split(step + 1, next_ids))
            self._event(rec, "post receives", "framing", rec.pipe_end, self._now())
        t0 = self._now()
        rec.send_wait_s = self.msg.wait_all()
        rec.end = self._now()
        self._event(rec, "wait sends", "comm", t0, rec.end)
        if self.module.is_last:
            rec.loss = sum(losses) / len(losses)
        return rec

    # -- forward
    def _forward(self, mb: int, mb_ids, rec: StepRecord, losses) -> tuple:
        r = rec.micro[mb]
        ids = mb_ids[mb]
        if self.prev_rank is None:
            x, _ = self.dataset.get(ids)
            x = x.to(self.device)
        else:
            x = self._receive(self.prev_rank, "fwd", mb, ids, rec)
            x.requires_grad_(True)
        t0 = self._now()
        out = self.module(x)
        loss = None
        if self.module.is_last:
            _, target = self.dataset.get(ids)
            loss = self.module.loss(out, target.to(self.device))
            losses.append(float(loss.detach()))
        t1 = self._now()
        r.fwd_compute_s += t1 - t0
        self._event(rec, f"F{mb}", "compute", t0, t1)
        if self.next_rank is not None:
            self._send(self.next_rank, "fwd", mb, out.detach(), ids, rec)
        return x, out, loss, ids

    # -- send (both directions)
    def _send(self, peer: int, direction: str, mb: int, tensor: torch.Tensor, ids, rec: StepRecord) -> None:
        """Encode micro-batch ``mb``'s activation (``"fwd"``) or input gradient
        (``"bwd"``) and start sending it to ``peer``; the codec and the framing
        (header, one buffer, isend) count as encode."""
        r = rec.micro[mb]
        what, comp = ("act", "fw_send") if direction == "fwd" else ("grad", "bw_send")
        t0 = self._now()
        payload = self.comp[comp].compress(tensor, key=ids)
        t1 = self._now()
        self._event(rec, f"encode {what} {mb}", "encode", t0, t1)
        body, over = self.msg.send(payload, ids, peer)
        t2 = self._now()
        self._event(rec, f"send {what} {mb}", "encode", t1, t2)
        r.encode_s += t2 - t0
        r.bytes_sent += body
        r.overhead_bytes += over
        rec.links.setdefault(peer, [0, 0.0])[0] += body

    # -- receive (both directions)
    def _receive(self, peer: int, direction: str, mb: int, ids, rec: StepRecord) -> torch.Tensor:
        """Receive micro-batch ``mb``'s activation (``direction="fwd"``) or gradient
        (``"bwd"``) from ``peer``, check its sample ids, decode it, and record the
        transfer, wait and decode times."""
        r = rec.micro[mb]
        what, comp = ("act", "fw_recv") if direction == "fwd" else ("grad", "bw_recv")
        shape = self.msg.shapes.get(peer)
        first = shape is None
        body = None if first or self.msg.posted[peer] else self.comp[comp].payload_nbytes(shape, key=ids)
        payload, got_ids, info = self.msg.recv(peer, body)
        if first:  # the link's first message told the shape: post the rest of this step
            self._posted[peer] = self._order[comp].index(mb) + 1
            self.post_receives(self._step_ids)
        if not torch.equal(got_ids, ids):
            raise RuntimeError(f"micro-batch {mb}: {what} arrived for other sample ids than the schedule's")
        setattr(r, f"{direction}_comm_s", getattr(r, f"{direction}_comm_s") + info.transfer_s)
        setattr(r, f"{direction}_wait_s", getattr(r, f"{direction}_wait_s") + info.wait_s)
        setattr(r, f"{direction}_span_s", getattr(r, f"{direction}_span_s") + max(0.0, info.done - info.sent))
        self._event(rec, f"recv {what} {mb}", "comm", info.done - info.transfer_s, info.done,
                    bytes=info.body_bytes)
        r.encode_s += info.unpack_s  # framing: header, views
        t0 = self._now()
        out = self.comp[comp].decompress(payload, key=ids).to(self.device)
        t1 = self._now()
        r.encode_s += t1 - t0
        self._event(rec, f"decode {what} {mb}", "encode", t0, t1)
        return out

    # -- backward
    def _backward(self, mb: int, saved: tuple, rec: StepRecord) -> None:
        r = rec.micro[mb]
        x, out, loss, ids = saved
        if self.next_rank is None:
            t0 = self._now()
            (loss / self.num_microbatches).backward()
        else:
            grad = self._receive(self.next_rank, "bwd", mb, ids, rec)
            t0 = self._now()
            out.backward(grad)
        t1 = self._now()
        r.bwd_compute_s += t1 - t0
        self._event(rec, f"B{mb}", "compute", t0, t1)
        if self.prev_rank is not None:
            self._send(self.prev_rank, "bwd", mb, x.grad.detach(), ids, rec)

