"""Execute the schedule tables of :mod:`perfsim.schedules` on one pipeline rank.

Each rank runs its device's row of the table with explicit communication
(:func:`perfsim.schedules.with_comms`, the same rows the simulator replays),
action by action; a rank may hold several stages (model chunks). ``kRECV_Fmb``
receives and decodes stage ``k``'s input activation; ``kFmb`` runs the forward;
``kSEND_Fmb`` compresses the output with the forward compressor of boundary
``k`` and sends it. ``RECV_B``/``SEND_B`` mirror this with activation
gradients and the backward compressor (AQ-SGD compresses forward activations by
their change against a per-sample message buffer and quantizes backward
gradients directly: "Fine-tuning Language Models over Slow Networks using
Activation Compression with Guarantees", arXiv:2206.01299, Sec. 3). A boundary between two
stages of one rank is a local hand-off (no codec). ``B`` is a whole backward;
zero-bubble tables split it into ``I`` (input gradient) and ``W`` (weight
gradient) with torch.distributed.pipelining's ``stage_backward_input`` /
``stage_backward_weight``; on stage 0, whose input has no gradient, ``I`` does
nothing and ``W`` runs the whole backward, as torch's ``PipelineStage`` does.

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
  thread while the sender computes, which costs milliseconds per message on a
  machine with few cores (``traces/measured/late_receive_busy_sender.py``;
  figures in docs/validation.md, "Measurement notes"). NCCL orders p2p
  operations on one stream per peer pair, so there a receive is posted when it
  is needed.

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
from perfsim.schedules import (BACKWARD, BACKWARD_WEIGHT, FORWARD, RECV_B, RECV_F, SEND_B,
                               SEND_F, Table, with_comms)

TAG_SIZES, TAG_BODY, TAG_MESSAGE = 0, 1, 2
TAGS_PER_CHANNEL = 3
_DTYPES = {str(d): d for d in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                               torch.float16, torch.bfloat16, torch.float32, torch.float64,
                               torch.bool)}


# ---------------------------------------------------------------- messaging
def _link(peer: int, channel: int):
    """Key of a (peer, channel) link; channel 0 is keyed by the peer alone."""
    return peer if channel == 0 else (peer, channel)


def channel_of(boundary: int, direction: str) -> int:
    """The message channel of pipeline boundary ``boundary`` (between stages
    ``boundary`` and ``boundary + 1``), direction ``"F"`` or ``"B"``."""
    return 2 * boundary + (0 if direction == FORWARD else 1)


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

    ``channel``: messages between two ranks travel on channels, each its own FIFO
    with its own tags (``TAGS_PER_CHANNEL * channel + TAG_*``) and its own first,
    self-describing message; a pipeline boundary and direction is one channel
    (:func:`channel_of`), so several boundaries between the same two ranks
    (interleaved schedules) never mix.
    """

    def __init__(self, device: torch.device, header_bytes: int = header_capacity(64)):
        self.device = device
        self.header_bytes = int(header_bytes)
        self.pending: list[tuple[Any, list[torch.Tensor]]] = []
        # links: a peer rank (channel 0) or (peer, channel), see _link
        self.described: set = set()  # links that carried their self-describing first message
        self.shapes: dict = {}  # incoming link -> payload shape learned from it
        self.posted: dict = defaultdict(deque)  # incoming link -> posted (work, buffer), in order
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

    def send(self, payload: Payload, ids: torch.Tensor, dst: int, channel: int = 0) -> tuple[int, int]:
        """Start sending ``payload`` + ``ids`` to global rank ``dst`` on ``channel``.
        Returns (body bytes, header (+ sizes) bytes)."""
        link, base = _link(dst, channel), TAGS_PER_CHANNEL * channel
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
        first = link not in self.described
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
            self.pending.append((dist.isend(sizes, dst, tag=base + TAG_SIZES), [sizes]))
            self.pending.append((dist.isend(buf, dst, tag=base + TAG_BODY), [buf]))
            self.described.add(link)
            return body, len(hbytes) + 16
        self.pending.append((dist.isend(buf, dst, tag=base + TAG_MESSAGE), [buf]))
        return body, len(hbytes)

    def post(self, src: int, body_nbytes: int, channel: int = 0) -> None:
        """Post the receive of the next message from ``src`` on ``channel`` (not a link's
        first), whose body is ``body_nbytes``; :meth:`recv` consumes posted receives in order."""
        buf = torch.empty(self.header_bytes + int(body_nbytes), dtype=torch.uint8, device=self.device)
        tag = TAGS_PER_CHANNEL * channel + TAG_MESSAGE
        self.posted[_link(src, channel)].append((dist.irecv(buf, src, tag=tag), buf))

    def recv(self, src: int, body_nbytes: int | None = None, channel: int = 0
             ) -> tuple[Payload, torch.Tensor, RecvInfo]:
        """Receive the next message from ``src`` on ``channel``: the oldest posted receive,
        else one posted now (``body_nbytes`` needed once the link's first message is in)."""
        posted = time.perf_counter()
        link, base = _link(src, channel), TAGS_PER_CHANNEL * channel
        if link in self.shapes:
            if not self.posted[link]:
                if body_nbytes is None:
                    raise RuntimeError(f"receive from rank {src}: nothing posted and no expected size")
                self.post(src, body_nbytes, channel)
            work, buf = self.posted[link].popleft()
            work.wait()
            hlen, framing = self.header_bytes, self.header_bytes
        else:  # the link's first message describes itself
            sizes = torch.empty(2, dtype=torch.int64, device=self.device)
            dist.recv(sizes, src, tag=base + TAG_SIZES)
            hlen, blen = (int(v) for v in sizes.tolist())
            buf = torch.empty(hlen + blen, dtype=torch.uint8, device=self.device)
            dist.recv(buf, src, tag=base + TAG_BODY)
            framing = hlen + 16
        done = time.perf_counter()
        blen = buf.numel() - hlen
        header = pickle.loads(buf[:hlen].cpu().numpy().tobytes())  # stops before the padding
        self.shapes[link] = tuple(header["shape"])
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


# ---------------------------------------------------------------- one rank
@dataclass
class MicroRecord:
    """Per micro-batch timings of one rank in one step, summed over its stages (seconds / bytes)."""

    fwd_compute_s: float = 0.0
    bwd_compute_s: float = 0.0  # B, or I + W
    fwd_comm_s: float = 0.0  # transfer of the incoming activation
    fwd_wait_s: float = 0.0  # blocked before the activation started arriving
    fwd_span_s: float = 0.0  # sender's send start -> received (upper bound of the transfer)
    bwd_comm_s: float = 0.0
    bwd_wait_s: float = 0.0
    bwd_span_s: float = 0.0
    encode_s: float = 0.0  # encode + decode on this rank, with the message framing (send, unpack)
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
    pipe_end: float = 0.0  # when this rank's last action finished
    dp_sync_s: float = 0.0
    dp_warmup: bool = False  # a 1-bit optimizer's uncompressed warm-up step
    dp_bytes: int = 0
    optimizer_s: float = 0.0
    tp_comm_s: float = 0.0  # tensor-parallel collectives (perfsim.runtime.tensor_parallel)
    tp_bytes: int = 0
    tied_bytes: int = 0  # wire bytes of the tied-embedding all-reduce (perfsim.runtime.tied)
    tp_ops: dict[str, int] = field(default_factory=dict)  # collective kind -> count
    links: dict[int, list[float]] = field(default_factory=dict)  # dst -> [bytes, busy_s]
    events: list[tuple] = field(default_factory=list)  # (name, cat, t0, t1, args)


@dataclass
class _Inbound:
    """One incoming channel: its peer rank, receiving compressor and micro-batch order."""

    peer: int
    channel: int
    comp: Any
    order: list[int]


class StageRunner:
    """Runs one pipeline rank's actions for a step.

    modules: ``{stage: perfsim.runtime.models.Stage}``, the stages this rank holds;
    table: the :class:`perfsim.schedules.Table`; device: this rank's pipeline index;
    rank_of: global rank of a pipeline device (this replica's);
    compressors: ``{stage: {"fw_send", "fw_recv", "bw_send", "bw_recv": compressor}}``
    (only the slots of boundaries that cross ranks);
    dataset: to load inputs (first stage) and targets (last stage) by sample id.
    """

    def __init__(self, modules: dict, table: Table, device_index: int, rank_of, compressors: dict,
                 dataset, micro_batch: int, device: torch.device, trace: bool = True):
        self.modules = modules
        self.table = table
        self.index = device_index
        self.actions = with_comms(table)[device_index]
        self.where, self.rank_of = table.stage_device, rank_of
        self.last_stage = table.num_stages - 1
        self.comp = compressors
        self.dataset = dataset
        self.micro_batch = micro_batch
        self.device = device
        self.msg = Messenger(device, header_capacity(micro_batch))
        self.trace = trace
        self.num_microbatches = table.num_microbatches
        # receives are posted ahead on gloo only (module docstring)
        self.post_ahead = dist.is_initialized() and dist.get_backend() == "gloo"
        self.inbound: dict[tuple[int, str], _Inbound] = {}  # (stage, "F"|"B") -> channel
        for a in self.actions:
            if a.kind in (RECV_F, RECV_B):
                fwd = a.kind == RECV_F
                key = (a.stage, FORWARD if fwd else BACKWARD)
                if key not in self.inbound:
                    boundary = a.stage - 1 if fwd else a.stage
                    peer = self.where[a.stage - 1] if fwd else self.where[a.stage + 1]
                    self.inbound[key] = _Inbound(rank_of(peer), channel_of(boundary, key[1]),
                                                 compressors[a.stage]["fw_recv" if fwd else "bw_recv"], [])
                self.inbound[key].order.append(a.microbatch)
        self._posted: dict[tuple[int, str], int] = {}  # channel -> receives of the coming step posted
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

    def post_receives(self, mb_ids: list[torch.Tensor]) -> None:
        """Post the receives of a step's micro-batches (``mb_ids``) that are not posted
        yet, on every channel whose first message has arrived (gloo only), in the
        order of the RECV actions of this rank's row (the sender's order per channel,
        checked by :func:`perfsim.schedules.with_comms`). Each size is the receiving
        compressor's ``payload_nbytes`` for the learned shape and ids: AQ-SGD's first
        visits travel in full, and sender and receiver store the same ids."""
        if not self.post_ahead:
            return
        for key, ch in self.inbound.items():
            shape = self.msg.shapes.get(_link(ch.peer, ch.channel))
            if shape is None:
                continue
            for mb in ch.order[self._posted.get(key, 0):]:
                self.msg.post(ch.peer, ch.comp.payload_nbytes(shape, key=mb_ids[mb]), ch.channel)
            self._posted[key] = len(ch.order)

    def run_step(self, step: int, epoch: int, ids: torch.Tensor,
                 next_ids: torch.Tensor | None = None) -> StepRecord:
        """Run every action of this rank for one step (no optimizer). ``next_ids``:
        the next step's samples, whose receives are posted as this step ends."""
        m = self.num_microbatches
        mb_ids = self._step_ids = self._split(step, ids)
        self.post_receives(mb_ids)
        rec = StepRecord(step, epoch, self._now(), 0.0, None, [MicroRecord() for _ in range(m)])
        self._inbox: dict[tuple[int, str, int], torch.Tensor] = {}  # (stage, F|B, mb) -> tensor
        self._live: dict[tuple[int, int], list] = {}  # (stage, mb) -> [x, out, loss, ids, W state]
        losses: list[float] = []
        for a in self.actions:
            k, mb, kind = a.stage, a.microbatch, a.kind
            if kind == RECV_F:
                self._inbox[(k, FORWARD, mb)] = self._receive(self.inbound[(k, FORWARD)], "fwd", mb, mb_ids[mb], rec)
            elif kind == RECV_B:
                self._inbox[(k, BACKWARD, mb)] = self._receive(self.inbound[(k, BACKWARD)], "bwd", mb,
                                                              mb_ids[mb], rec)
            elif kind == FORWARD:
                self._forward(k, mb, mb_ids, rec, losses)
            elif kind == SEND_F:
                out = self._live[(k, mb)][1]
                self._send(self.rank_of(self.where[k + 1]), channel_of(k, FORWARD), self.comp[k]["fw_send"],
                           "fwd", mb, out.detach(), mb_ids[mb], rec)
            elif kind == SEND_B:
                grad = self._inbox.pop((k - 1, BACKWARD, mb))
                self._send(self.rank_of(self.where[k - 1]), channel_of(k - 1, BACKWARD), self.comp[k]["bw_send"],
                           "bwd", mb, grad, mb_ids[mb], rec)
            else:
                self._backward(k, mb, kind, rec)
        rec.pipe_end = self._now()
        self._posted = {}
        if next_ids is not None:
            self.post_receives(self._split(step + 1, next_ids))
            self._event(rec, "post receives", "framing", rec.pipe_end, self._now())
        t0 = self._now()
        rec.send_wait_s = self.msg.wait_all()
        rec.end = self._now()
        self._event(rec, "wait sends", "comm", t0, rec.end)
        if losses:
            rec.loss = sum(losses) / len(losses)
        return rec

    # -- forward
    def _forward(self, k: int, mb: int, mb_ids, rec: StepRecord, losses) -> None:
        ids = mb_ids[mb]
        module = self.modules[k]
        if k == 0:
            x, _ = self.dataset.get(ids)
            x = x.to(self.device)
        else:  # received, or handed over by stage k-1 on this rank
            x = self._inbox.pop((k, FORWARD, mb))
            x.requires_grad_(True)
        t0 = self._now()
        out = module(x)
        loss = None
        if k == self.last_stage:
            _, target = self.dataset.get(ids)
            loss = module.loss(out, target.to(self.device))
            losses.append(float(loss.detach()))
        t1 = self._now()
        rec.micro[mb].fwd_compute_s += t1 - t0
        self._event(rec, f"{k}F{mb}", "compute", t0, t1)
        self._live[(k, mb)] = [x, out, loss, ids, None]
        if k < self.last_stage and self.where[k + 1] == self.index:
            self._inbox[(k + 1, FORWARD, mb)] = out.detach()

    # -- send (both directions)
    def _send(self, peer: int, channel: int, comp, direction: str, mb: int, tensor: torch.Tensor, ids,
              rec: StepRecord) -> None:
        """Encode micro-batch ``mb``'s activation (``"fwd"``) or input gradient
        (``"bwd"``) and start sending it to ``peer`` on ``channel``; the codec and the
        framing (header, one buffer, isend) count as encode."""
        r = rec.micro[mb]
        what = "act" if direction == "fwd" else "grad"
        t0 = self._now()
        payload = comp.compress(tensor, key=ids)
        t1 = self._now()
        self._event(rec, f"encode {what} {mb}", "encode", t0, t1)
        body, over = self.msg.send(payload, ids, peer, channel)
        t2 = self._now()
        self._event(rec, f"send {what} {mb}", "encode", t1, t2)
        r.encode_s += t2 - t0
        r.bytes_sent += body
        r.overhead_bytes += over
        rec.links.setdefault(peer, [0, 0.0])[0] += body

    # -- receive (both directions)
    def _receive(self, ch: _Inbound, direction: str, mb: int, ids, rec: StepRecord) -> torch.Tensor:
        """Receive micro-batch ``mb``'s activation (``direction="fwd"``) or gradient
        (``"bwd"``) on channel ``ch``, check its sample ids, decode it, and record the
        transfer, wait and decode times."""
        r = rec.micro[mb]
        what = "act" if direction == "fwd" else "grad"
        link = _link(ch.peer, ch.channel)
        shape = self.msg.shapes.get(link)
        first = shape is None
        body = None if first or self.msg.posted[link] else ch.comp.payload_nbytes(shape, key=ids)
        payload, got_ids, info = self.msg.recv(ch.peer, body, ch.channel)
        if first:  # the channel's first message told the shape: post the rest of this step
            key = next(key for key, c in self.inbound.items() if c is ch)
            self._posted[key] = ch.order.index(mb) + 1
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
        out = ch.comp.decompress(payload, key=ids).to(self.device)
        t1 = self._now()
        r.encode_s += t1 - t0
        self._event(rec, f"decode {what} {mb}", "encode", t0, t1)
        return out

    # -- backward: B, I, W
    def _backward(self, k: int, mb: int, kind: str, rec: StepRecord) -> None:
        # lazy: torch is heavy, needed only here
        from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

        saved = self._live[(k, mb)]
        x, out, loss, ids, wstate = saved
        module = self.modules[k]
        last = k == self.last_stage
        t0 = self._now()
        if kind != BACKWARD_WEIGHT:
            root, grad = ((loss / self.num_microbatches), None) if last else (out, self._inbox.pop((k, BACKWARD, mb)))
            if kind == BACKWARD:
                root.backward(grad)
            elif k > 0:
                _, groups = stage_backward_input([root], None if grad is None else [grad], [x],
                                                 module.parameters())
                saved[4] = groups
            else:  # stage 0: no input gradient; W runs the whole backward
                saved[4] = (root, grad)
            if k > 0:
                # the input gradient: to stage k-1 here, or to SEND_B
                self._inbox[(k - 1, BACKWARD, mb)] = x.grad.detach()
        else:
            if k > 0:
                stage_backward_weight(module.parameters(), wstate)
            else:
                root, grad = wstate
                root.backward(grad)
        t1 = self._now()
        rec.micro[mb].bwd_compute_s += t1 - t0
        self._event(rec, f"{k}{kind}{mb}", "compute", t0, t1)
        if kind in (BACKWARD, BACKWARD_WEIGHT):
            del self._live[(k, mb)]
