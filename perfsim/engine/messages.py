"""The pipeline's messages in the event loop: the backend's handler and the blocking exchange.

A device hands each pipeline message to the network backend
(:meth:`perfsim.network.backend.NetworkBackend.send`, with the receiver's
``post_receive`` when it reaches the action that waits for it); the backend tells the
engine, as the message's :class:`perfsim.network.backend.MessageHandler`, when its bytes
start moving, when the last byte left and when it arrived -- :class:`PipelineMessages`,
which :class:`perfsim.engine.sim.Simulation` is. How messages share NICs, token buckets
and rendezvous are the backend's.

A message is the engine's own record, passed back untouched: ``(inbox key, bytes,
micro-batch, FORWARD or BACKWARD, replica, sending device (its row of the table), source GPU,
destination GPU, the sender's DeviceStats)``; its arrival fires ``inbox[key]``, which the receiver
waits on.

Megatron-LM's blocking exchanges (``System.p2p_exchange == "blocking"``;
:func:`perfsim.schedules.exchange_rows`): after each compute step a device posts one
batch -- the sends of the step before and the receives of the step after -- and waits
for all of them, a send until its delivery (:meth:`PipelineMessages._exchange`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from perfsim.schedules import FORWARD

if TYPE_CHECKING:
    from perfsim.engine.sim_output import DeviceStats


class PipelineMessages:
    """The pipeline-message half of :class:`perfsim.engine.sim.Simulation` (its
    :class:`~perfsim.network.backend.MessageHandler`): it reads the simulation's
    environment, network, inboxes, statistics and trace."""

    # ------------------------------------------------------------ the backend's handler
    def message_started(self, msg) -> None:
        """Its bytes start moving: both ends communicate (interference)."""
        if self.slowdown:
            self._comm((msg[6], msg[7]), +1)

    def message_sent(self, msg, start: float, end: float) -> None:
        """Its last byte left at ``end``: the link was busy since ``start``."""
        nbytes, src, dst = msg[1], msg[6], msg[7]
        if self.slowdown:
            self._comm((src, dst), -1)
        link = self.links[(src, dst, "p2p")]
        link[0] += nbytes
        link[1] += end - start
        msg[8].bytes_sent += nbytes

    def message_delivered(self, msg, started: float) -> None:
        """It arrived: the receiver's inbox fires -- triggered, its callbacks run now, as
        SimPy's ``step`` does when it pops a triggered event: a delivered message wakes its
        receiver in the delivery's own step instead of one more step at the same instant
        (inside a running process, a backend that delivers from one, it is scheduled as usual)."""
        key, _, mb, kind, r, s, src, dst, st = msg
        env = self.env
        now = env._now
        dur = now - started
        st.comm_s += dur
        if r == self.replicas[0]:  # the breakdown table reports the first replica
            self.micro[(r, s, mb)]["fwd_comm_s" if kind == FORWARD else "bwd_comm_s"] += dur
        if self.want_trace:
            self._span(f"{'act' if kind == FORWARD else 'grad'} mb{mb} {s}->{key[1]}", "comm", r,
                       1000 + s, started, now, {"src": src, "dst": dst})
        ack = self.acks.pop(key, None) if self.acks else None
        if ack is not None:  # a blocking exchange's send completes with its delivery
            ack.succeed()
        box = self.inbox.get(key)
        if box is None:
            box = self.inbox[key] = env.event()
        if env._active_proc is not None:
            box.succeed()
            return
        box._ok, box._value = True, None
        callbacks, box.callbacks = box.callbacks, None
        for callback in callbacks:
            callback(box)

    # ------------------------------------------------------------ blocking exchanges
    def _exchange(self, op: tuple, r: int, d: int, st: DeviceStats, cells, chain: bool, t):
        """Replica ``r``'s device ``d`` runs one blocking exchange ``op`` (``(EXCHANGE, receives,
        sends)``, :func:`perfsim.engine.programs.device_program`), Megatron's batch: each send's
        encode, then every receive posted and every message sent at once, waited on to the end
        (a send until its delivery), then each receive's decode. ``cells``: the breakdown's
        micro-batch cells (None: another replica's); ``chain``, ``t``: the local steps pending
        since the device's last wait (:meth:`perfsim.engine.sim.Simulation.device`). Returns
        the new ``t``."""
        env, net, inbox, devs = self.env, self.net, self.inbox, self._dev
        me, scratch = devs[(r, d)], self._scratch
        _, recvs, sends = op
        for _, a, k, mb, peer, k2, tag, encode, nbytes, mkind, what in sends:
            if encode > 0:  # each send's encode (and host cost) before the batch starts
                cell = scratch if cells is None else cells[(r, d, mb)]
                t = yield from self._host_step(chain, t, st, cell, r, d, encode, what, k, mb)
        if t is not None:
            yield self._at(t)
            t = None
        waits = []
        posts = getattr(net, "receives_posted", True)  # False: post_receive would do nothing
        for _, a, k, mb, peer, tag, decode, what in recvs:
            key = (r, k, tag, mb)
            if posts:
                net.post_receive(key, me, devs[(r, peer)])
            box = inbox.get(key)
            if box is None:
                box = inbox[key] = env.event()
            waits.append(box)
        for _, a, k, mb, peer, k2, tag, encode, nbytes, mkind, what in sends:
            key, dst = (r, k2, tag, mb), devs[(r, peer)]
            waits.append(self.acks.setdefault(key, env.event()))  # done once delivered
            net.send(me, dst, nbytes, key, self.lanes, self, (key, nbytes, mb, mkind, r, d, me, dst, st))
        for ev in waits:
            yield ev
        for _, a, k, mb, peer, tag, decode, what in recvs:
            del inbox[(r, k, tag, mb)]
            if decode > 0:  # each receive's decode (the TP all-gather, host cost) after it
                cell = scratch if cells is None else cells[(r, d, mb)]
                t = yield from self._host_step(chain, t, st, cell, r, d, decode, what, k, mb)
        return t

    def _host_step(self, chain: bool, t, st, cell, r, d, seconds, what, k, mb):
        """An encode or decode of ``seconds`` (with its message's host cost) in a blocking exchange:
        added to the chain's pending end ``t`` (:meth:`perfsim.engine.sim.Simulation.device`), or
        run now; returns the new ``t``."""
        if chain:
            st.codec_s += seconds
            cell["encode_s"] += seconds
            return (self.env._now if t is None else t) + seconds
        yield from self._codec(st, cell, r, d, seconds, what, k, mb)
        return t
