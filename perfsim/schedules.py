"""Pipeline schedules as data.

A schedule is a pure function ``(num_devices, num_microbatches, virtual_stages)
-> Table``: per device, the compute actions it runs in order, and the map from
(virtual) stage to device. An :class:`Action` prints as ``0F3`` (stage 0,
forward, micro-batch 3), as in torchtitan's and torch.distributed.pipelining's
tables. The simulator (``perfsim.engine``) and the runtime (``perfsim.runtime``)
both consume these tables and their communication (:func:`with_comms`): neither
re-derives an order of its own.

Action kinds (torch's ``_ComputationType`` letters): ``F`` forward, ``B`` full
backward, ``I`` backward for the input gradient only and ``W`` the deferred
weight-gradient work of that micro-batch (the zero-bubble split; what the ZB
paper calls B and W), and the communication kinds ``SEND_F``/``RECV_F``/
``SEND_B``/``RECV_B`` that :func:`with_comms` adds.

Model chunks: the model is cut into ``num_stages = num_devices * V`` stages;
``Table.stage_device[k]`` is the device of stage ``k``. Data flows
``k -> k+1`` forward and back; a boundary between two stages of one device is
a local hand-off (no message).

References: GPipe (Huang et al., arXiv:1811.06965); 1F1B (PipeDream-Flush,
Narayanan et al., arXiv:2006.09503); interleaved 1F1B (Narayanan et al.,
"Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", arXiv:2104.04473, Sec. 2.2.2); ZB-H1 and ZB-V (Qi et al.,
"Zero Bubble Pipeline Parallelism", arXiv:2401.10241, Sec. 3 and 6). The
interleaved and zero-bubble orders are those of torch.distributed.pipelining
(``ScheduleInterleaved1F1B``, ``ScheduleInterleavedZeroBubble`` with one
stage per rank, ``ScheduleZBVZeroBubble``), checked action by action in the tests.
"""

from __future__ import annotations

import functools
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterator

from perfsim.errors import ConfigError

FORWARD = "F"
BACKWARD = "B"  # full backward (input and weight gradients)
BACKWARD_INPUT = "I"
BACKWARD_WEIGHT = "W"
SEND_F, RECV_F, SEND_B, RECV_B = "SEND_F", "RECV_F", "SEND_B", "RECV_B"
COMPUTE_KINDS = (FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT)
COMM_KINDS = (SEND_F, RECV_F, SEND_B, RECV_B)
_ACTION_RE = re.compile(r"(\d+)(SEND_F|RECV_F|SEND_B|RECV_B|F|B|I|W)(\d+)")


@dataclass(frozen=True, order=True)
class Action:
    """One step of one (virtual) stage on one micro-batch."""

    stage: int
    kind: str  # one of COMPUTE_KINDS or COMM_KINDS
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"

    @classmethod
    def parse(cls, text: str) -> "Action":
        """Inverse of ``str``: ``"0F3" -> Action(0, "F", 3)``."""
        m = _ACTION_RE.fullmatch(text.strip())
        if m is None:
            raise ConfigError(f"action {text!r}: expected <stage><F|B|I|W|SEND_F|...><mb>")
        return cls(int(m.group(1)), m.group(2), int(m.group(3)))

    @property
    def is_compute(self) -> bool:
        return self.kind in COMPUTE_KINDS


@dataclass(frozen=True)
class Table:
    """A schedule: ``rows[d]`` is device ``d``'s actions in order, ``stage_device[k]``
    the device of stage ``k``. Indexing and iterating go over the device rows."""

    rows: tuple[tuple[Action, ...], ...]
    stage_device: tuple[int, ...]
    num_microbatches: int
    name: str = ""

    def __getitem__(self, device: int) -> list[Action]:
        return list(self.rows[device])

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[list[Action]]:
        return (list(r) for r in self.rows)

    @property
    def num_devices(self) -> int:
        return len(self.rows)

    @property
    def num_stages(self) -> int:
        return len(self.stage_device)

    @property
    def virtual_stages(self) -> int:
        return self.num_stages // self.num_devices

    def stages_of(self, device: int) -> list[int]:
        """The stages (model chunks) that live on ``device``, in model order."""
        return [k for k, d in enumerate(self.stage_device) if d == device]

    @property
    def splits_backward(self) -> bool:
        """True when the backward runs as I + W (zero-bubble schedules)."""
        return any(a.kind == BACKWARD_WEIGHT for row in self.rows for a in row)


Schedule = Table


def _check(num_devices: int, num_microbatches: int, virtual_stages: int) -> None:
    for name, v in (("num_stages", num_devices), ("num_microbatches", num_microbatches),
                    ("virtual_stages", virtual_stages)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(f"{name}={v!r}: must be an integer >= 1")


def _one_chunk(name: str, virtual_stages: int | None) -> None:
    if virtual_stages not in (None, 1):
        raise ConfigError(f"virtual_stages={virtual_stages}: schedule {name!r} runs one stage per device")


def _table(rows, p: int, m: int, name: str, stage_device=None) -> Table:
    return Table(tuple(tuple(r) for r in rows), tuple(stage_device or range(p)), m, name)


def gpipe(num_stages: int, num_microbatches: int, virtual_stages: int | None = None) -> Table:
    """GPipe: every stage runs F0..F(m-1), then B0..B(m-1)."""
    _one_chunk("gpipe", virtual_stages)
    _check(num_stages, num_microbatches, 1)
    m = num_microbatches
    return _table([[Action(s, FORWARD, i) for i in range(m)] + [Action(s, BACKWARD, i) for i in range(m)]
                   for s in range(num_stages)], num_stages, m, "gpipe")


def one_f_one_b(num_stages: int, num_microbatches: int, virtual_stages: int | None = None) -> Table:
    """1F1B (PipeDream-Flush): ``min(p-s-1, m)`` warm-up forwards, then
    alternate F and B, then the remaining backwards. Stage ``s`` never holds more
    than ``min(p - s, m)`` un-backpropagated micro-batches."""
    _one_chunk("1f1b", virtual_stages)
    _check(num_stages, num_microbatches, 1)
    p, m = num_stages, num_microbatches
    rows = []
    for s in range(p):
        warmup = min(p - s - 1, m)
        actions = [Action(s, FORWARD, i) for i in range(warmup)]
        f, b = warmup, 0
        while f < m:
            actions += [Action(s, FORWARD, f), Action(s, BACKWARD, b)]
            f, b = f + 1, b + 1
        actions.extend(Action(s, BACKWARD, i) for i in range(b, m))
        rows.append(actions)
    return _table(rows, p, m, "1f1b")


def _rounds(p: int, m: int, name: str) -> int:
    """Micro-batches per round of the interleaved orders: Megatron-LM needs m % p == 0;
    torch's flexible variant runs ``max(1, m // p)`` rounds of ``m / rounds``."""
    rounds = max(1, m // p)
    if m % rounds:
        raise ConfigError(f"num_microbatches={m}: {name} needs a multiple of {rounds} "
                          f"(rounds of max(1, m // pp) micro-batches)")
    return m // rounds


def _looped_rows(p: int, m: int, v: int, zero_bubble: bool) -> list[list[Action]]:
    """Megatron's interleaved order (arXiv:2104.04473 Sec. 2.2.2), per device ``d``:
    forwards walk the local chunks in groups of ``mpr`` micro-batches (depth first),
    ``(v-1)*mpr + 2(p-1-d)`` warm-up forwards, then one F and one B, then the
    remaining backwards (chunks in reverse). ``zero_bubble``: ZB-H1's variant
    (arXiv:2401.10241 Sec. 3.1) -- ``p-1-d`` warm-up forwards, the backward is
    I, and device ``d`` delays each W by ``d`` backward slots (its bubble)."""
    mpr = _rounds(p, m, "zb-h1" if zero_bubble else "interleaved-1f1b")
    total = m * v
    rows = []
    for d in range(p):
        warmup = min((v - 1) * mpr + (1 if zero_bubble else 2) * (p - 1 - d), total)
        nxt: dict[tuple[int, str], int] = defaultdict(int)

        def act(stage: int, kind: str) -> Action:
            mb = nxt[stage, kind]
            nxt[stage, kind] = mb + 1
            return Action(stage, kind, mb)

        f_stage = lambda k: ((k // mpr) % v) * p + d  # noqa: E731
        b_stage = lambda j: (v - 1 - (j // mpr) % v) * p + d  # noqa: E731
        bkind = BACKWARD_INPUT if zero_bubble else BACKWARD
        row = [act(f_stage(k), FORWARD) for k in range(warmup)]
        w_done = 0
        for j in range(total):  # j-th backward, with the (warmup + j)-th forward if any
            if warmup + j < total:
                row.append(act(f_stage(warmup + j), FORWARD))
            row.append(act(b_stage(j), bkind))
            if zero_bubble and j >= d:
                row.append(act(b_stage(w_done), BACKWARD_WEIGHT))
                w_done += 1
        while zero_bubble and w_done < total:
            row.append(act(b_stage(w_done), BACKWARD_WEIGHT))
            w_done += 1
        rows.append(row)
    return rows


def interleaved_1f1b(num_devices: int, num_microbatches: int, virtual_stages: int | None = None) -> Table:
    """Interleaved 1F1B: ``virtual_stages`` (default 2) model chunks per device, stage
    ``k`` on device ``k % p`` (Megatron-LM's looped placement). With constant chunk
    times the bubble shrinks V-fold: ``(p-1)(f+b)/V`` (arXiv:2104.04473 Sec. 2.2.2)."""
    v = 2 if virtual_stages is None else virtual_stages
    _check(num_devices, num_microbatches, v)
    p, m = num_devices, num_microbatches
    return _table(_looped_rows(p, m, v, False), p, m, "interleaved-1f1b",
                  [k % p for k in range(p * v)])


def zb_h1(num_stages: int, num_microbatches: int, virtual_stages: int | None = None) -> Table:
    """ZB-H1: 1F1B with the backward split into I and W, W placed in the bubble;
    peak activation memory as 1F1B's, bubble ``(p-1)(F + I - W)`` with the paper's
    B written I here (arXiv:2401.10241 Sec. 2.1 / 3.1)."""
    _one_chunk("zb-h1", virtual_stages)
    _check(num_stages, num_microbatches, 1)
    return _table(_looped_rows(num_stages, num_microbatches, 1, True), num_stages,
                  num_microbatches, "zb-h1")


def zb_v(num_devices: int, num_microbatches: int, virtual_stages: int | None = None) -> Table:
    """ZB-V: two chunks per device in a V (stage ``k`` on device ``k`` for ``k < p``,
    else ``2p-1-k``), so device 0 holds the first and the last stage; warm-up
    ``2(p-d)-1`` forwards of chunk 0, then pairs, then F-I-W per chunk
    (arXiv:2401.10241 Sec. 6; the order of torch's ``ScheduleZBVZeroBubble``,
    run with ``max(2p-1, m)`` micro-batches and the extra ones dropped)."""
    if virtual_stages not in (None, 2):
        raise ConfigError(f"virtual_stages={virtual_stages}: zb-v runs exactly 2 stages per device")
    _check(num_devices, num_microbatches, 2)
    p, m = num_devices, num_microbatches
    n = max(2 * p - 1, m)
    rows = []
    for d in range(p):
        c0, c1 = d, 2 * p - 1 - d
        cnt: dict[tuple[int, str], int] = defaultdict(int)
        row: list[Action] = []

        def add(stage: int, kind: str) -> None:
            row.append(Action(stage, kind, cnt[stage, kind]))
            cnt[stage, kind] += 1

        for _ in range(2 * (p - d) - 1):
            add(c0, FORWARD)
        for _ in range(d):
            add(c1, FORWARD)
            add(c0, FORWARD)
        for _ in range(p - d):
            add(c1, FORWARD)
            add(c1, BACKWARD_INPUT)
            add(c1, BACKWARD_WEIGHT)
        while cnt[c1, FORWARD] < cnt[c0, FORWARD] or cnt[c0, FORWARD] < n:
            if cnt[c0, FORWARD] < n:
                add(c0, FORWARD)
            add(c0, BACKWARD_INPUT)
            add(c0, BACKWARD_WEIGHT)
            add(c1, FORWARD)
            add(c1, BACKWARD_INPUT)
            add(c1, BACKWARD_WEIGHT)
        for _ in range(d):
            add(c0, BACKWARD_INPUT)
            add(c1, BACKWARD_INPUT)
        for _ in range(p - d):
            add(c0, BACKWARD_INPUT)
            add(c0, BACKWARD_WEIGHT)
        for c in (c1, c0):
            while cnt[c, BACKWARD_WEIGHT] < cnt[c, BACKWARD_INPUT]:
                add(c, BACKWARD_WEIGHT)
        rows.append([a for a in row if a.microbatch < m])
    return _table(rows, p, m, "zb-v", [k if k < p else 2 * p - 1 - k for k in range(2 * p)])


SCHEDULES: dict[str, Callable[..., Table]] = {
    "gpipe": gpipe, "1f1b": one_f_one_b, "interleaved-1f1b": interleaved_1f1b,
    "zb-h1": zb_h1, "zb-v": zb_v,
}


def get_schedule(name: str) -> Callable[..., Table]:
    """Look a schedule up by name; call it with ``(pp, num_microbatches, virtual_stages=None)``."""
    try:
        return SCHEDULES[name.lower()]
    except KeyError:
        raise ConfigError(f"schedule {name!r}: unknown (choose from {', '.join(SCHEDULES)})") from None


def build_table(name: str, pp: int, num_microbatches: int, virtual_stages: int | None = None) -> Table:
    """The checked table of schedule ``name`` (ConfigError naming what does not fit).
    A table is an immutable value of its arguments, so it is built and checked once
    per process (a planner asks for the same few tables thousands of times)."""
    return _checked_table(name.lower(), pp, num_microbatches, virtual_stages)


@functools.lru_cache(maxsize=256)
def _checked_table(name: str, pp: int, num_microbatches: int, virtual_stages: int | None) -> Table:
    table = get_schedule(name)(pp, num_microbatches, virtual_stages)
    check_table(table)
    return table


#: one stage per device, each backward whole: their stages compute alike per micro-batch
PLAIN_SCHEDULES = ("gpipe", "1f1b")

#: schedules whose stages per device the user chooses (``virtual_stages``)
VIRTUAL_STAGE_SCHEDULES = ("interleaved-1f1b",)


def stage_count(name: str, virtual_stages: int | None) -> int:
    """Stages (model chunks) per device that schedule ``name`` runs."""
    if name.lower() == "interleaved-1f1b":
        return 2 if virtual_stages is None else virtual_stages
    return 2 if name.lower() == "zb-v" else 1


# ---------------------------------------------------------------- checks and memory
def check_table(table: Table) -> None:
    """Every stage runs F and either B or I then W of every micro-batch exactly once,
    on its own device, and the table runs to the end when every action waits for its
    inputs (no deadlock). Raises ConfigError naming the first problem."""
    m = table.num_microbatches
    seen: dict[int, list[Action]] = defaultdict(list)
    for d, row in enumerate(table.rows):
        for a in row:
            if table.stage_device[a.stage] != d:
                raise ConfigError(f"{table.name}: action {a} on device {d}, its stage lives on "
                                  f"{table.stage_device[a.stage]}")
            seen[a.stage].append(a)
    for k in range(table.num_stages):
        kinds = sorted({a.kind for a in seen[k]} - {FORWARD})
        for kind in (FORWARD, *kinds):
            mbs = sorted(a.microbatch for a in seen[k] if a.kind == kind)
            if mbs != list(range(m)):
                raise ConfigError(f"{table.name}: stage {k} runs {kind} on micro-batches {mbs}")
        if kinds not in ([BACKWARD], [BACKWARD_INPUT, BACKWARD_WEIGHT]):
            raise ConfigError(f"{table.name}: stage {k} backward kinds {kinds}")
    done: set[tuple[int, str, int]] = set()
    pos = [0] * table.num_devices
    while any(pos[d] < len(r) for d, r in enumerate(table.rows)):
        moved = False
        for d, row in enumerate(table.rows):
            while pos[d] < len(row) and all(x in done for x in _needs(row[pos[d]], table.num_stages)):
                a = row[pos[d]]
                done.add((a.stage, a.kind, a.microbatch))
                pos[d] += 1
                moved = True
        if not moved:
            stuck = [str(r[pos[d]]) for d, r in enumerate(table.rows) if pos[d] < len(r)]
            raise ConfigError(f"{table.name}: deadlock, every device waits ({' '.join(stuck)})")


def _needs(a: Action, num_stages: int) -> list[tuple[int, str, int]]:
    """Compute actions that must be done before ``a`` can run."""
    k, mb = a.stage, a.microbatch
    if a.kind == FORWARD:
        return [(k - 1, FORWARD, mb)] if k > 0 else []
    own = [(k, FORWARD, mb)]
    if a.kind == BACKWARD_WEIGHT:
        return [(k, BACKWARD_INPUT, mb)]
    if k == num_stages - 1:
        return own
    # the output gradient comes from the next stage's B (or its I, in split tables)
    return own + [(k + 1, BACKWARD if a.kind == BACKWARD else BACKWARD_INPUT, mb)]


@dataclass(frozen=True)
class HeldWork:
    """Peak memory-relevant state of one device over a schedule.

    activations: peak (stage, micro-batch) pairs whose forward ran and whose
      backward has not released them (B, or W for the zero-bubble split: W still
      reads the layer inputs), in units of one stage's activations per micro-batch;
    weight_grads: peak pairs whose I ran and W not yet (ZB's held weight-gradient
      work: the output gradients W consumes stay alive until it runs);
    stage_fraction: share of the device's layers in one of those units (1/V)."""

    activations: int
    weight_grads: int
    stage_fraction: float


def held_work(table: Table) -> list[HeldWork]:
    """Per device, the peak number of micro-batches whose activations it holds and
    of pending weight-gradient (W) work (memory model: 1F1B holds ``min(m, p - s)``,
    GPipe ``m``; ZB-H1 holds 1F1B's peak ``min(m, p)`` on every device,
    arXiv:2401.10241 Sec. 3.1)."""
    out = []
    for row in table.rows:
        live = pend = peak_live = peak_pend = 0
        for a in row:
            if a.kind == FORWARD:
                live += 1
            elif a.kind in (BACKWARD, BACKWARD_WEIGHT):
                live -= 1
            if a.kind == BACKWARD_INPUT:
                pend += 1
            elif a.kind == BACKWARD_WEIGHT:
                pend -= 1
            peak_live, peak_pend = max(peak_live, live), max(peak_pend, pend)
        out.append(HeldWork(peak_live, peak_pend, 1.0 / table.virtual_stages))
    return out


def max_in_flight(actions: list[Action]) -> int:
    """Peak number of (stage, micro-batch) pairs forwarded but not yet released by
    B or W on one device (activation-memory proxy; :func:`held_work`)."""
    live = peak = 0
    for a in actions:
        live += 1 if a.kind == FORWARD else -1 if a.kind in (BACKWARD, BACKWARD_WEIGHT) else 0
        peak = max(peak, live)
    return peak


# ---------------------------------------------------------------- communication
def with_comms(table: Table) -> list[list[Action]]:
    """Per device, the compute actions with explicit communication (as torch's
    ``_add_send_recv``): ``kRECV_Fmb`` right before the forward of stage ``k`` that
    needs the activation from stage ``k-1`` on another device, ``kSEND_Fmb`` right
    after the forward of stage ``k`` whose output goes to another device;
    ``RECV_B`` / ``SEND_B`` likewise before a B/I and after the B/I of the
    gradient's producer. A boundary inside one device is a local hand-off.

    Each directed boundary is one FIFO channel (:func:`channels`): the receiver
    consumes messages in the order the sender sends them, which is checked."""
    sd, n = table.stage_device, table.num_stages
    rows = []
    for d, row in enumerate(table.rows):
        out: list[Action] = []
        for a in row:
            k, mb = a.stage, a.microbatch
            if a.kind == FORWARD and k > 0 and sd[k - 1] != d:
                out.append(Action(k, RECV_F, mb))
            if a.kind in (BACKWARD, BACKWARD_INPUT) and k < n - 1 and sd[k + 1] != d:
                out.append(Action(k, RECV_B, mb))
            out.append(a)
            if a.kind == FORWARD and k < n - 1 and sd[k + 1] != d:
                out.append(Action(k, SEND_F, mb))
            if a.kind in (BACKWARD, BACKWARD_INPUT) and k > 0 and sd[k - 1] != d:
                out.append(Action(k, SEND_B, mb))
        rows.append(out)
    sends: dict[tuple, list[int]] = defaultdict(list)
    recvs: dict[tuple, list[int]] = defaultdict(list)
    for row in rows:
        for a in row:
            if a.kind in COMM_KINDS:
                ch = comm_channel(a)
                (sends if a.kind.startswith("SEND") else recvs)[ch].append(a.microbatch)
    for ch, order in sends.items():
        if recvs[ch] != order:
            raise ConfigError(f"{table.name}: boundary {ch} sends micro-batches in order {order} "
                              f"but they are received in order {recvs[ch]}")
    return rows


#: how a device waits on its pipeline messages (``System.p2p_exchange``): ``async`` -- each
#: send leaves without waiting and each receive waits right before the compute that needs it
#: (isend/irecv: torch.distributed.pipelining, ``perfsim run``; :func:`with_comms`);
#: ``blocking`` -- Megatron-LM's exchanges between compute steps (:func:`exchange_rows`);
#: ``deepspeed`` -- DeepSpeed's pipeline engine, each message its own blocking call in its
#: instruction order (:func:`deepspeed_rows`)
P2P_EXCHANGES = ("async", "blocking", "deepspeed")


def exchange_rows(table: Table) -> list[list]:
    """Per device, its compute actions with Megatron-LM's blocking exchanges between them: each
    exchange is a tuple of the communication actions of :func:`with_comms` that one
    ``_communicate`` call moves -- the sends of the step before it and the receives of the step
    after it -- and the device waits until all of them completed (one ``batch_isend_irecv``,
    each request waited on, then ``torch.cuda.synchronize()``). A step is one compute action;
    in an interleaved table, a forward directly followed by a backward is one step (Megatron's
    steady state runs both, then ``send_forward_backward_recv_forward_backward``). Empty
    exchanges are left out.

    Source: NVIDIA/Megatron-LM ``megatron/schedules.py``
    (``forward_backward_pipelining_with_interleaving``, ``..._without_interleaving``; stored
    commit 1c3a1e6a09e198bd25dced268583ba538ad0f13a) and ``megatron/p2p_communication.py``
    (``_communicate``; 46c74b4ca06a7794db1e2615544095535cdf12c2). Each interleaved exchange
    holds exactly what Megatron's ``recv_prev`` / ``recv_next`` rules move in it (checked against
    an independent implementation of those rules, ``tests/engine/megatron_interleaved.py``). Without
    interleaving, as Megatron's 1F1B: ``send_forward_recv_backward`` after a forward that a
    backward follows in its steady state, ``send_backward_recv_forward`` after a backward that a
    forward follows, and otherwise (warm-up, cool-down, a device with no steady state when
    ``m < p - d``) the send and the receive are two calls (``send_forward`` then ``recv_forward``)."""
    pair = table.name == "interleaved-1f1b"
    out = []
    for d, row in enumerate(with_comms(table)):
        recv_of: dict[Action, list[Action]] = {}
        send_of: dict[Action, list[Action]] = {}
        pending: list[Action] = []
        last = None
        for a in row:
            if a.kind in (RECV_F, RECV_B):
                pending.append(a)
            elif a.kind in (SEND_F, SEND_B):
                send_of[last].append(a)
            else:
                recv_of[a], send_of[a], pending, last = pending, [], [], a
        steps: list[list[Action]] = []
        for a in table.rows[d]:
            if (pair and a.kind == BACKWARD and steps and len(steps[-1]) == 1
                    and steps[-1][0].kind == FORWARD):
                steps[-1].append(a)
            else:
                steps.append([a])
        new: list = []
        sends: list[Action] = []
        before = None  # the previous step's kind
        steady = table.num_microbatches > table.num_devices - 1 - d  # 1F1B: more than its warm-up
        for step in steps:
            recvs = [r for a in step for r in recv_of[a]]
            # Megatron's 1F1B: send_forward, then recv_forward (likewise backward); a forward and
            # the backward after it share one call only in its steady state
            if not pair and (before == step[0].kind or (before == FORWARD and not steady)):
                new.extend(ex for ex in (tuple(sends), tuple(recvs)) if ex)
            elif sends or recvs:
                new.append(tuple(sends + recvs))
            new.extend(step)
            sends = [x for a in step for x in send_of[a]]
            before = step[-1].kind
        if sends:
            new.append(tuple(sends))
        out.append(new)
    return out


def _deepspeed_step(step: int, stage: int, stages: int) -> tuple[int, bool]:
    """The micro-batch of DeepSpeed's ``TrainSchedule`` step ``step`` on ``stage`` (invalid
    ones lie outside ``0..m-1``) and whether that step is a forward: even stages run forwards
    on even steps, odd stages on odd steps (``_step_to_micro_batch``)."""
    half = step // 2  # DeepSpeed's step // 2 on even steps, (step - 1) // 2 on odd ones
    if (step % 2 == 0) == (stage % 2 == 0):
        return half - stage // 2, True
    if step % 2 == 0:  # an odd stage's backward
        return half - stages + (stage + 1) // 2, False
    return half - stages + 1 + stage // 2, False  # an even stage's backward


def deepspeed_rows(table: Table) -> list[list]:
    """Per device, the order in which DeepSpeed's pipeline engine issues its instructions, each
    pipeline message one blocking call: a one-action exchange (:func:`exchange_rows`'s tuples),
    waited on to its end (a send until its delivery).

    ``TrainSchedule`` runs ``2 (m + p - 1)`` steps on every stage, a forward step and a
    backward step in turn (some of them empty). A forward step first receives its activation
    (``RecvActivation``), then sends the input gradient of the step before (``SendGrad``), then
    computes; a backward step first sends the activation of the step before
    (``SendActivation``), then receives its output gradient (``RecvGrad``), then computes. So a
    message leaves one step after the compute that made it, behind a blocking receive, and
    every message costs its transfer on both ends. The compute order is 1F1B's (checked).

    Source: microsoft/DeepSpeed ``deepspeed/runtime/pipe/schedule.py`` (``TrainSchedule.steps``,
    ``_step_to_micro_batch``; stored commit 077e6740178eba4ccff1b3ea9a7981578d3d42e4), whose
    ``SendActivation`` / ``RecvActivation`` / ``SendGrad`` / ``RecvGrad`` are documented as
    blocking and paired; the engine that Megatron-DeepSpeed's pipeline runs on."""
    if table.name != "1f1b":
        raise ConfigError(f"p2p_exchange deepspeed: DeepSpeed's pipeline engine runs schedule 1f1b "
                          f"(its TrainSchedule), not {table.name!r}")
    p, m = table.num_devices, table.num_microbatches
    out = []
    for d, row in enumerate(table.rows):
        compute = {(a.kind, a.microbatch): a for a in row}
        new: list = []
        order: list[Action] = []
        prev = -1
        for step in range(2 * (m + p - 1)):
            mb, forward = _deepspeed_step(step, d, p)
            now, before = 0 <= mb < m, 0 <= prev < m
            if forward and d > 0:
                new += [(Action(d, RECV_F, mb),)] if now else []
                new += [(Action(d, SEND_B, prev),)] if before else []
            elif not forward and d < p - 1:
                new += [(Action(d, SEND_F, prev),)] if before else []
                new += [(Action(d, RECV_B, mb),)] if now else []
            if now:
                order.append(compute[(FORWARD if forward else BACKWARD, mb)])
                new.append(order[-1])
            prev = mb
        if order != list(row):  # DeepSpeed's steps visit 1F1B's compute order
            raise AssertionError(f"device {d}: DeepSpeed's order {order} is not the table's {list(row)}")
        out.append(new)
    return out


def comm_channel(a: Action) -> tuple[int, str]:
    """The directed boundary a communication action uses: ``(boundary, "F"|"B")`` where
    boundary ``k`` lies between stages ``k`` and ``k+1``."""
    if a.kind == SEND_F:
        return a.stage, FORWARD
    if a.kind == RECV_F:
        return a.stage - 1, FORWARD
    if a.kind == SEND_B:
        return a.stage - 1, BACKWARD
    if a.kind == RECV_B:
        return a.stage, BACKWARD
    raise ValueError(f"{a} is not a communication action")


def format_table(table) -> str:
    """One line per device, e.g. ``stage 0: 0F0 0F1 0B0 0B1``."""
    return "\n".join(f"stage {s}: " + " ".join(map(str, row)) for s, row in enumerate(table))


class PipelineShape:
    """What a pipeline's schedule follows from, for a config with ``pp``, ``schedule``,
    ``virtual_stages``, ``micro_batch`` and ``macro_batch`` fields (:class:`perfsim.config.Strategy`
    of the simulator, :class:`perfsim.runtime.config.RunConfig` of execute mode)."""

    pp: int
    schedule: str
    virtual_stages: int | None
    micro_batch: int
    macro_batch: int

    @property
    def num_microbatches(self) -> int:
        return self.macro_batch // self.micro_batch

    @property
    def num_stages(self) -> int:
        """Model chunks in the pipeline: pp x the schedule's stages per device."""
        return self.pp * stage_count(self.schedule, self.virtual_stages)

    def table(self):
        """The schedule table every rank runs (:func:`perfsim.schedules.build_table`)."""
        return build_table(self.schedule, self.pp, self.num_microbatches, self.virtual_stages)
