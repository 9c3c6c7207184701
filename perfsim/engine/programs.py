"""A device's program: its schedule row with every cost resolved once.

The event loop (:class:`perfsim.engine.sim.Simulation`) walks, per device, the row of
the schedule table with explicit communication (:attr:`perfsim.engine.plan.Plan.comm_rows`,
from :func:`perfsim.schedules.with_comms`; or, with Megatron-LM's blocking exchanges,
:func:`perfsim.schedules.exchange_rows`). :func:`device_program` turns that row into
program steps, the same for every replica, so the walk only looks values up:

* a compute step ``(kind, action, stage, micro-batch, seconds, tensor-parallel seconds,
  sharded, last, column)``: its seconds from the stage's plan (a zero-bubble backward is
  ``I`` then a later ``W``, :attr:`perfsim.engine.plan.StagePlan.wgrad_s`), its
  tensor-parallel collectives' seconds (both less what a combined forward/backward pair saves,
  ``--ep-overlap``: :mod:`perfsim.engine.ep_overlap`), whether it runs unit by unit (ZeRO-2/3,
  :mod:`perfsim.engine.sharding`) and whether it completes the stage's weight gradients
  (its buckets' gradient sync starts inside it);
* a receive or a send as :func:`comm_step` gives it;
* a blocking exchange ``(EXCHANGE, receives, sends)``.
"""

from __future__ import annotations

from perfsim.engine.ep_overlap import shortened
from perfsim.engine.plan import Plan
from perfsim.schedules import (BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, FORWARD, RECV_B, RECV_F,
                               SEND_B, SEND_F)

#: a program step of :func:`device_program`: one blocking exchange (``System.p2p_exchange``)
EXCHANGE = "EXCHANGE"


def device_program(plan: Plan, d: int, row: list, buckets: list, warmup: bool) -> list[tuple]:
    """Device ``d``'s ``row`` (its actions, a blocking exchange as a tuple of them) as program
    steps (module docstring). ``buckets``: per stage its gradient buckets (a stage without any
    completes no gradient sync); ``warmup``: the pipeline compressor's first-epoch wire sizes."""
    last_grad = {}  # stage -> its last action that completes weight gradients
    for a in plan.table[d]:
        if a.kind in (BACKWARD, BACKWARD_WEIGHT):
            last_grad[a.stage] = a
    prog = []
    for a in row:
        if isinstance(a, tuple):  # a blocking exchange: its receives and its sends
            ops = [comm_step(plan, x, warmup) for x in a]
            prog.append((EXCHANGE, [o for o in ops if o[0] in (RECV_F, RECV_B)],
                         [o for o in ops if o[0] in (SEND_F, SEND_B)]))
            continue
        k, mb, kind = a.stage, a.microbatch, a.kind
        sp = plan.stages[k]
        if kind in (RECV_F, RECV_B, SEND_F, SEND_B):
            op = comm_step(plan, a, warmup)
        else:
            seconds = {FORWARD: sp.fwd_s, BACKWARD: sp.bwd_s, BACKWARD_INPUT: sp.bwd_s - sp.wgrad_s,
                       BACKWARD_WEIGHT: sp.wgrad_s}[kind]
            # tensor-parallel collectives, serial with the compute (the backward's
            # reduce the input gradient: they go with B or I, not W)
            tp_s = sp.fwd_tp_s if kind == FORWARD else 0.0 if kind == BACKWARD_WEIGHT else sp.bwd_tp_s
            # --ep-overlap: an action of a combined forward/backward pair hides some of its all-to-alls
            seconds, tp_s = shortened(seconds, tp_s, plan.ep_savings.get((k, mb, kind), 0.0))
            sharded = bool(sp.units) and kind in (FORWARD, BACKWARD)  # ZeRO-2/3: collectives per unit
            last = a is last_grad.get(k) and bool(buckets[k])
            op = (kind, a, k, mb, seconds, tp_s, sharded, last,
                  "fwd_compute_s" if kind == FORWARD else "bwd_compute_s")
        prog.append(op)
    return prog


def comm_step(plan: Plan, a, warmup: bool) -> tuple:
    """A communication action's program step (:func:`device_program`): a receive adds the sending
    stage's device, the inbox tag, the decode seconds and its trace label; a send the
    receiving stage's device, its stage, the tag, the encode seconds, the bytes, the
    message kind and its label."""
    where = plan.table.stage_device
    k, mb, kind = a.stage, a.microbatch, a.kind
    sp = plan.stages[k]
    if kind == RECV_F:
        return (kind, a, k, mb, where[k - 1], "F", plan.stages[k - 1].fw_decode_s, "decode act")
    if kind == RECV_B:
        return (kind, a, k, mb, where[k + 1], "B", sp.bw_decode_s, "decode grad")
    if kind == SEND_F:
        nbytes = sp.fw_bytes_warmup if warmup else sp.fw_bytes
        return (kind, a, k, mb, where[k + 1], k + 1, "F", sp.fw_encode_s, nbytes, FORWARD, "encode act")
    # SEND_B: the gradient of boundary (k-1, k) is described by stage k-1's plan
    prev = plan.stages[k - 1]
    return (kind, a, k, mb, where[k - 1], k - 1, "B", prev.bw_encode_s, prev.bw_bytes, BACKWARD, "encode grad")
