"""An independent reference for the tests: Megatron-LM's interleaved 1F1B as its 2021 code runs it.

NVIDIA/Megatron-LM ``megatron/schedules.py``, ``forward_backward_pipelining_with_interleaving``
(commit 1c3a1e6a09e198bd25dced268583ba538ad0f13a, the one version stored, later than 2021; its rules taken as
2021's, as arXiv:2104.04473 Sec. 2.2.2 describes them), and ``megatron/p2p_communication.py``
``_communicate`` (commit
46c74b4ca06a7794db1e2615544095535cdf12c2): every exchange is one ``batch_isend_irecv`` of up to four
operations, waited on, then ``torch.cuda.synchronize()``.

Written from that code, not from :mod:`perfsim.schedules`: per rank, the program of forward and
backward steps on model chunks and the exchanges between them, with Megatron's own ``recv_prev`` /
``recv_next`` rules (including the first stage's "ahead of the last stage by p - 1" rule) and its
``input_tensors`` / ``output_tensor_grads`` queues. The tensors are matched FIFO per directed
channel, as NCCL matches point-to-point operations, and :func:`check_deliveries` replays the queues
to show that every forward and backward consumes the tensor it needs.

:func:`blocking_times` times the programs as Megatron runs them: a rank computes its steps in
order, and an exchange completes once every rank whose operation it matches has reached its own
exchange (a send of more than NCCL's buffer progresses only while the receiver's kernel runs),
plus the transfer. :func:`free_running_times` times the same compute order with asynchronous
sends (a send never waits; a step waits only for its own input), which is perfsim's default.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Exchange:
    """One ``_communicate`` call: what the rank sends (tensor ids) and whether it receives."""

    send_next: tuple | None = None  # ("F", stage, mb): the output of a forward, to rank + 1
    send_prev: tuple | None = None  # ("B", stage, mb): an input gradient, to rank - 1
    recv_prev: bool = False
    recv_next: bool = False
    # filled by match(): the ids received, and where (chunk queue) Megatron puts them
    got_prev: tuple | None = None
    got_next: tuple | None = None
    prev_chunk: int | None = None
    next_chunk: int | None = None
    partners: list = field(default_factory=list)  # (rank, program index) of matched operations


def program(p: int, m: int, v: int, rank: int) -> list:
    """Rank ``rank``'s steps: ``("F", chunk)``, ``("B", chunk)`` and :class:`Exchange`, in
    Megatron's order for ``p`` ranks, ``m`` micro-batches (a multiple of ``p``), ``v`` chunks."""
    if m % p:
        raise ValueError("Megatron-LM: number of microbatches is not divisible by pipeline-parallel size")
    total = m * v
    all_warmup = m == p
    warmup = total if all_warmup else min((p - rank - 1) * 2 + (v - 1) * p, total)
    remaining = total - warmup
    first, last = rank == 0, rank == p - 1
    S = p * v

    def chunk(k: int, forward: bool) -> int:
        c = (k % (p * v)) // p
        return c if forward else v - 1 - c

    runs = {"F": [0] * v, "B": [0] * v}  # steps run per chunk (the next micro-batch of its queue)

    def step(k: int, kind: str) -> tuple:
        """Run the ``k``-th forward or backward; the id of the tensor it produces."""
        c = chunk(k, kind == "F")
        mb = runs[kind][c]
        runs[kind][c] += 1
        out.append((kind, c))
        return (kind, c * p + rank, mb)

    out: list = []
    # recv_forward before the warm-up (chunk 0): nothing on the first stage
    if not first:
        out.append(Exchange(recv_prev=True, prev_chunk=0))
    for k in range(warmup):
        y = step(k, "F")
        nxt = chunk(k + 1, True)
        recv_prev = not (first and nxt == 0) and k != total - 1
        send = None if y[1] == S - 1 else y
        if k == warmup - 1 and not all_warmup:
            out.append(Exchange(send_next=send, recv_prev=recv_prev, recv_next=not last,
                                prev_chunk=nxt, next_chunk=v - 1))
        else:
            out.append(Exchange(send_next=send, recv_prev=recv_prev, prev_chunk=nxt))
    for k in range(remaining):
        fk = k + warmup
        y = step(fk, "F")
        g = step(k, "B")
        send_next = None if y[1] == S - 1 else y
        send_prev = None if g[1] == 0 else g
        recv_prev = True
        if first:
            nfc = chunk(fk - (p - 1), True)
            recv_prev = nfc != v - 1
            nfc += 1
        else:
            nfc = chunk(fk + 1, True)
        recv_next = True
        if last:
            nbc = chunk(k - (p - 1), False)
            recv_next = nbc != 0
            nbc -= 1
        else:
            nbc = chunk(k + 1, False)
        if k == remaining - 1:
            recv_prev = False
        out.append(Exchange(send_next=send_next, send_prev=send_prev, recv_prev=recv_prev, recv_next=recv_next,
                            prev_chunk=nfc, next_chunk=nbc))
    if all_warmup and not last:
        out.append(Exchange(recv_next=True, next_chunk=v - 1))
    for k in range(remaining, total):
        g = step(k, "B")
        nbc = chunk(k + 1, False)
        recv_next = not (last and nbc == v - 1) and k != total - 1
        out.append(Exchange(send_prev=None if g[1] == 0 else g, recv_next=recv_next, next_chunk=nbc))
    # drop exchanges that move nothing (Megatron's _communicate then only synchronises)
    return [s for s in out if not isinstance(s, Exchange)
            or s.send_next or s.send_prev or s.recv_prev or s.recv_next]


def program_1f1b(p: int, m: int, rank: int) -> list:
    """Rank ``rank``'s steps in Megatron's non-interleaved 1F1B
    (``forward_backward_pipelining_without_interleaving``): ``p - rank - 1`` warm-up forwards, each
    ``recv_forward``, forward, ``send_forward``; then forward, ``send_forward_recv_backward``,
    backward, ``send_backward_recv_forward`` (the last one ``send_backward``); then the cool-down's
    ``recv_backward``, backward, ``send_backward``. One chunk: ``("F", 0)`` / ``("B", 0)``."""
    first, last = rank == 0, rank == p - 1
    warmup = min(p - rank - 1, m)
    remaining = m - warmup
    out: list = []
    nf = nb = 0

    def fwd() -> tuple | None:
        nonlocal nf
        out.append(("F", 0))
        nf += 1
        return None if last else ("F", rank, nf - 1)

    def bwd() -> tuple | None:
        nonlocal nb
        out.append(("B", 0))
        nb += 1
        return None if first else ("B", rank, nb - 1)

    for _ in range(warmup):
        out.append(Exchange(recv_prev=not first, prev_chunk=0))
        out.append(Exchange(send_next=fwd()))
    if remaining:
        out.append(Exchange(recv_prev=not first, prev_chunk=0))
    for i in range(remaining):
        out.append(Exchange(send_next=fwd(), recv_next=not last, next_chunk=0))
        g = bwd()
        if i == remaining - 1:
            out.append(Exchange(send_prev=g))
        else:
            out.append(Exchange(send_prev=g, recv_prev=not first, prev_chunk=0))
    for _ in range(warmup):
        out.append(Exchange(recv_next=not last, next_chunk=0))
        out.append(Exchange(send_prev=bwd()))
    return [s for s in out if not isinstance(s, Exchange)
            or s.send_next or s.send_prev or s.recv_prev or s.recv_next]


def programs(p: int, m: int, v: int) -> list[list]:
    """Every rank's :func:`program` (``v == 1``: :func:`program_1f1b`), its tensors matched
    (:func:`match`)."""
    progs = [program_1f1b(p, m, r) if v == 1 else program(p, m, v, r) for r in range(p)]
    match(progs)
    return progs


def match(progs: list[list]) -> None:
    """Match sends and receives FIFO per directed channel (rank -> rank + 1 carries forward
    outputs, rank -> rank - 1 input gradients, both around the ring): the k-th receive from a
    channel gets the k-th tensor sent on it."""
    p = len(progs)
    sends: dict[tuple, list] = {}
    for r, prog in enumerate(progs):
        for i, s in enumerate(prog):
            if isinstance(s, Exchange):
                if s.send_next:
                    sends.setdefault((r, (r + 1) % p, "F"), []).append((s.send_next, r, i))
                if s.send_prev:
                    sends.setdefault((r, (r - 1) % p, "B"), []).append((s.send_prev, r, i))
    taken: dict[tuple, int] = {}
    for r, prog in enumerate(progs):
        for i, s in enumerate(prog):
            if not isinstance(s, Exchange):
                continue
            for flag, ch, attr in ((s.recv_prev, ((r - 1) % p, r, "F"), "got_prev"),
                                   (s.recv_next, ((r + 1) % p, r, "B"), "got_next")):
                if flag:
                    n = taken.get(ch, 0)
                    taken[ch] = n + 1
                    tensor, r2, i2 = sends[ch][n]
                    setattr(s, attr, tensor)
                    s.partners.append((r2, i2))
                    progs[r2][i2].partners.append((r, i))
    for ch, lst in sends.items():
        if taken.get(ch, 0) != len(lst):
            raise AssertionError(f"channel {ch}: {len(lst)} sent, {taken.get(ch, 0)} received")


def compute_order(progs: list[list], p: int) -> list[list[str]]:
    """Per rank its forwards and backwards as perfsim prints actions (``0F3``: stage, kind, mb)."""
    out = []
    for r, prog in enumerate(progs):
        nf: dict[int, int] = {}
        row = []
        for s in prog:
            if isinstance(s, tuple):
                kind, c = s
                n = nf.get((kind, c), 0)
                nf[(kind, c)] = n + 1
                row.append(f"{c * p + r}{kind}{n}")
        out.append(row)
    return out


def check_deliveries(progs: list[list], p: int, v: int) -> None:
    """Replay Megatron's queues: a forward of chunk ``c`` reads ``input_tensors[c][-1]`` (its
    input, from stage ``c*p + r - 1``, same micro-batch; none on the first stage); a backward pops
    ``output_tensor_grads[c][0]`` (from stage ``c*p + r + 1``; none on the last). Raises
    AssertionError naming the first step that would read the wrong tensor."""
    S = p * v
    for r, prog in enumerate(progs):
        inputs = [[] for _ in range(v)]
        grads = [[] for _ in range(v)]
        nf = [0] * v
        nb = [0] * v
        for i, s in enumerate(prog):
            if isinstance(s, Exchange):
                if s.got_prev is not None:
                    inputs[s.prev_chunk].append(s.got_prev)
                if s.got_next is not None:
                    grads[s.next_chunk].append(s.got_next)
                continue
            kind, c = s
            stage = c * p + r
            if kind == "F":
                if stage > 0:
                    want = ("F", stage - 1, nf[c])
                    got = inputs[c][-1] if inputs[c] else None
                    assert got == want, f"rank {r} step {i}: forward of stage {stage} reads {got}, needs {want}"
                nf[c] += 1
            else:
                if stage < S - 1:
                    want = ("B", stage + 1, nb[c])
                    got = grads[c].pop(0) if grads[c] else None
                    assert got == want, f"rank {r} step {i}: backward of stage {stage} reads {got}, needs {want}"
                nb[c] += 1


def blocking_times(progs: list[list], p: int, fwd_s, bwd_s, xfer_s: float) -> tuple[float, list[float], list[float]]:
    """(iteration end, each rank's end, each rank's compute) when every exchange blocks: it
    completes at the latest of its own start and its partners' starts, plus ``xfer_s``.
    ``fwd_s(stage, mb)``, ``bwd_s(stage, mb)``: seconds."""
    ptr = [0] * p
    t = [0.0] * p
    busy = [0.0] * p
    posted: dict[tuple, float] = {}
    runs: list[dict] = [{} for _ in range(p)]  # (kind, chunk) -> how many ran: the micro-batch
    while any(ptr[r] < len(progs[r]) for r in range(p)):
        moved = False
        for r in range(p):
            while ptr[r] < len(progs[r]):
                s = progs[r][ptr[r]]
                if isinstance(s, tuple):
                    kind, c = s
                    mb = runs[r].get(s, 0)
                    runs[r][s] = mb + 1
                    dt = (fwd_s if kind == "F" else bwd_s)(c * p + r, mb)
                    t[r] += dt
                    busy[r] += dt
                else:
                    posted[(r, ptr[r])] = t[r]
                    if any(x not in posted for x in s.partners):
                        break
                    t[r] = max([t[r]] + [posted[x] for x in s.partners]) + xfer_s
                ptr[r] += 1
                moved = True
        if not moved:
            raise AssertionError(f"deadlock at {ptr}")
    return max(t), t, busy


def free_running_times(progs: list[list], p: int, fwd_s, bwd_s, xfer_s: float) -> tuple[float, list[float], list[float]]:
    """The same compute order with asynchronous sends (costs as :func:`blocking_times`): a forward
    starts once its input has arrived (``xfer_s`` after its producer ended), a backward once its own forward ran and its
    output gradient has arrived; nothing else waits."""
    order = compute_order(progs, p)
    nst = 1 + max(int(a.split("F")[0]) for row in order for a in row if "F" in a)
    ptr, t, busy = [0] * p, [0.0] * p, [0.0] * p
    done: dict[tuple, float] = {}
    while any(ptr[r] < len(order[r]) for r in range(p)):
        moved = False
        for r in range(p):
            while ptr[r] < len(order[r]):
                kind = "F" if "F" in order[r][ptr[r]] else "B"
                stage, mb = (int(x) for x in order[r][ptr[r]].split(kind))
                need = ((stage - 1, "F", mb) if kind == "F" and stage > 0 else
                        (stage + 1, "B", mb) if kind == "B" and stage < nst - 1 else None)
                if (need is not None and need not in done) or (kind == "B" and (stage, "F", mb) not in done):
                    break
                dt = (fwd_s if kind == "F" else bwd_s)(stage, mb)
                t[r] = (t[r] if need is None else max(t[r], done[need] + xfer_s)) + dt
                busy[r] += dt
                done[(stage, kind, mb)] = t[r]
                ptr[r] += 1
                moved = True
        if not moved:
            raise AssertionError(f"deadlock at {ptr}")
    return max(t), t, busy
