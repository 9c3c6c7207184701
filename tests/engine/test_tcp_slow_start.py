"""TCP slow start after idle (perfsim.tcp.SlowStart): the closed form against a segment-by-segment
sender, Linux's restart window, the flow backend's per-connection history, the steady state
across iterations, the switch, the host's sysctls and bad values."""

import importlib.util
import math
from pathlib import Path

import pytest
import simpy

from perfsim.api import predict
from perfsim.config import System
from perfsim.errors import ConfigError
from perfsim.fabrics import NIC_KINDS
from perfsim.network.analytic import Network
from perfsim.network.flows import FlowBackend
from perfsim.tcp import (INIT_CWND_SEGMENTS, MSS_BYTES, PROFILE_KEY, RTO_MIN_S, SlowStart, full_cwnd,
                         pipe_segments, resolve_slow_start, restart_cwnd, rto_s, slow_start_delay)

from _helpers import run_cli_here

M = MSS_BYTES


def _acked_sender(nbytes: float, rate_bps: float, rtt_s: float, cwnd: int) -> float:
    """When the last byte of ``nbytes`` leaves a sender that starts at 0 with ``cwnd`` segments:
    segments serialised at ``rate_bps``, each acknowledged ``rtt_s`` after it left, every ACK
    adding one segment to the window (Linux tcp_slow_start) -- an ACK-clocked simulation,
    segment by segment, independent of the closed form's rounds."""
    n = math.ceil(nbytes / M)
    tx = M * 8.0 / rate_bps
    acks: list[float] = []  # arrival times of the ACKs of the segments sent, in order
    link_free, sent, acked, w = 0.0, 0, 0, cwnd
    while sent < n:
        if sent - acked < w:  # the window allows one more: it leaves when the link is free
            link_free += tx
            acks.append(link_free + rtt_s)
            sent += 1
            continue
        now = acks[acked]  # wait for the next ACK
        acked += 1
        w += 1
        link_free = max(link_free, now)
    return link_free


@pytest.mark.parametrize("rate_bps,rtt_s,mbytes", [
    (10e6, 0.04, 6.55), (100e6, 0.04, 0.62), (100e6, 0.04, 6.55), (400e6, 0.08, 6.55),
    (1e9, 0.04, 0.05), (1e9, 0.1, 200.0), (400e6, 0.04, 0.014)])
def test_closed_form_matches_an_ack_clocked_sender(rate_bps, rtt_s, mbytes):
    """Last byte out at ``S / rate + extra``: the closed form and the segment-by-segment sender
    agree within one segment's serialisation per round (the closed form starts a round one RTT
    after the previous one, the ACK clock one segment later)."""
    nbytes = mbytes * 1e6
    extra, after = slow_start_delay(nbytes, rate_bps, rtt_s, INIT_CWND_SEGMENTS)
    full = math.ceil(nbytes / M) * M * 8.0 / rate_bps
    got = _acked_sender(nbytes, rate_bps, rtt_s, INIT_CWND_SEGMENTS)
    rounds = math.ceil(math.log2(max(pipe_segments(rate_bps, rtt_s) / INIT_CWND_SEGMENTS, 1))) + 1
    assert got - full == pytest.approx(extra, abs=rounds * M * 8.0 / rate_bps + 1e-12)
    assert after == min(INIT_CWND_SEGMENTS + math.ceil(nbytes / M), full_cwnd(rate_bps, rtt_s))


def test_closed_form_cases():
    # a full window costs nothing; the window covering the pipe already: nothing either
    assert slow_start_delay(6.5e6, 100e6, 0.04, full_cwnd(100e6, 0.04))[0] == 0.0
    assert slow_start_delay(6.5e6, 100e6, 0.04, 346)[0] == 0.0  # b = 345.3 segments
    # 100 Mbit/s, 40 ms: b = 345.3 -> 6 rounds to fill it; 6.5 MB needs more, so all six are paid
    b = pipe_segments(100e6, 0.04)
    assert b == pytest.approx(345.3, abs=0.05)
    extra = slow_start_delay(6.5e6, 100e6, 0.04, 10)[0]
    assert extra == pytest.approx(6 * 0.04 - 10 * 63 * M * 8 / 100e6)
    # a message inside the initial window: no round trip is waited for
    assert slow_start_delay(10 * M, 100e6, 0.04, 10)[0] == 0.0
    # no round trip: nothing
    assert slow_start_delay(6.5e6, 100e6, 0.0, 10) == (0.0, 10)


def test_linux_restart_window_halves_per_rto():
    """tcp_cwnd_restart: after an idle spell of more than one RTO the window is halved once per
    further RTO, down to the restart window min(10, cwnd); a shorter spell keeps it."""
    rto = rto_s(0.04)
    assert rto == pytest.approx(0.04 + RTO_MIN_S)
    assert restart_cwnd(690, 0.9 * rto, rto) == 690
    assert restart_cwnd(690, 1.5 * rto, rto) == 345
    assert restart_cwnd(690, 2.5 * rto, rto) == 172
    assert restart_cwnd(690, 100 * rto, rto) == INIT_CWND_SEGMENTS
    assert restart_cwnd(6, 100 * rto, rto) == 6  # never above what it held


class _Handler:
    """The engine's side of the backend: when each message arrived."""

    def __init__(self, env):
        self.env = env
        self.arrived = {}

    def message_started(self, msg):
        pass

    def message_sent(self, msg, start, end):
        pass

    def message_delivered(self, msg, start):
        self.arrived[msg] = (start, self.env.now)


def _two_messages(idle_s: float, setting: str = "on", nbytes: float = 2e6):
    """Two messages on one connection over 100 Mbit/s, 20 ms one way: the second sent ``idle_s``
    after the first's last byte left. Returns (network, [(start, arrival)] per message)."""
    net = Network(System(nic_kind="ethernet", bandwidth_bps=100e6, latency_s=0.02, gpus_per_node=1,
                         tcp_slow_start_after_idle=setting), 2)
    env = simpy.Environment()
    fb, h = FlowBackend(env, net), _Handler(env)
    fb.send(0, 1, nbytes, "a", 1, h, "a")
    env.run()
    t2 = fb.conns[(0, 1)].last + idle_s
    env.run(until=t2)
    fb.send(0, 1, nbytes, "b", 1, h, "b")
    env.run()
    return net, fb, [h.arrived["a"], h.arrived["b"]]


def test_backend_charges_a_message_after_a_long_idle_and_not_after_a_short_one():
    nbytes = 2e6
    net, fb, ((s1, a1), (s2, a2)) = _two_messages(5.0, nbytes=nbytes)
    path = net.path(0, 1)
    assert path.rtt_s == pytest.approx(0.04)
    plain = path.latency_s + nbytes * 8 / path.bandwidth_bps
    assert a1 - s1 == pytest.approx(plain, rel=1e-12)  # no history: a full window
    extra, _ = slow_start_delay(nbytes, path.bandwidth_bps, 0.04, INIT_CWND_SEGMENTS)  # 5 s: down to IW
    assert extra > 0.1
    assert a2 - s2 == pytest.approx(plain + extra, rel=1e-12)
    # 0.2 s < RTO (0.24 s): the window is kept, the second message costs what the first did
    _, _, ((s1, a1), (s2, a2)) = _two_messages(0.2, nbytes=nbytes)
    assert a2 - s2 == pytest.approx(plain, rel=1e-12)
    # off: the long idle costs nothing
    _, fb_off, ((s1, a1), (s2, a2)) = _two_messages(5.0, "off", nbytes=nbytes)
    assert a2 - s2 == pytest.approx(plain, rel=1e-12) and fb_off.slow_start is None


def test_no_round_trip_no_restart():
    """An emulated run's latency is the messenger's (no sch_netem here): the prediction of such a
    row takes the mechanism off (perfsim.analysis.validate); and a path without latency has no
    round trip to restart over, whatever the setting."""
    net = Network(System(nic_kind="ethernet", bandwidth_bps=100e6, latency_s=0.0, gpus_per_node=1,
                         tcp_slow_start_after_idle="on"), 2)
    assert net.path(0, 1).rtt_s == 0.0 and not net.prices_slow_start
    kw = dict(bandwidth="100Mbps", pp=2, compress="fp32")
    on, off = predict(**kw, tcp_slow_start_after_idle="on").summary, predict(**kw).summary
    assert on["iteration_s"] == off["iteration_s"] and on["engine"] == off["engine"]


def test_switch_and_steady_state_across_iterations():
    """Default (auto, no host recorded): today's numbers to the bit, closed-form replay included;
    on: the event loop, slower by the restarts -- also of each connection's first message, which
    follows its last one of the iteration before (the history of a previous iteration)."""
    kw = dict(bandwidth="100Mbps", latency="20ms", pp=4, dp=2, compress="aqsgd:fw3bw6")
    auto, off, on = (predict(**kw, **x).summary for x in
                     ({}, dict(tcp_slow_start_after_idle="off"), dict(tcp_slow_start_after_idle="on")))
    for k in ("iteration_s", "comm_s", "engine", "dp_sync_s"):
        assert auto[k] == off[k]
    assert "auto, no host" in auto["tcp_slow_start_after_idle"] and on["tcp_slow_start_after_idle"].startswith("on")
    # collectives are not charged: the gradient sync lasts what it did, give or take its overlap
    assert on["dp_sync_s"] == pytest.approx(off["dp_sync_s"], rel=1e-3)
    one = dict(kw, dp=1)
    off1 = predict(**one).summary
    on1 = predict(**one, tcp_slow_start_after_idle="on").summary
    assert on1["engine"] == "event loop" and on1["iteration_s"] > off1["iteration_s"] * 1.05


def test_steady_history_seeds_only_connections_idle_past_their_rto():
    net, fb, _ = _two_messages(0.2)
    first, last, cwnd = fb.tcp_history()[(0, 1)]
    assert first == 0.0 and cwnd == full_cwnd(net.path(0, 1).bandwidth_bps, 0.04)
    assert fb.steady_history(period=last + 0.1) == {}  # 0.1 s of wrap-around idle < RTO
    assert fb.steady_history(period=last + 1.0) == {(0, 1): (last - (last + 1.0), cwnd)}


def test_auto_follows_the_recorded_host():
    """auto: on where the profile recorded sysctl 1 and a congestion control without its own
    cong_control hook (BBR keeps its estimate over idle: tcp_slow_start_after_idle_check returns
    early); off where it recorded 0 or bbr, or recorded nothing."""
    n = NIC_KINDS["ethernet"].tcp_connections

    def host(**rec):
        return {PROFILE_KEY: {"tcp_rmem": [4096, 131072, 6291456], "tcp_wmem": [4096, 16384, 4194304], **rec}}

    assert resolve_slow_start("auto", None, n, host(tcp_slow_start_after_idle=1,
                                                    tcp_congestion_control="cubic")).on
    assert not resolve_slow_start("auto", None, n, host(tcp_slow_start_after_idle=1,
                                                        tcp_congestion_control="bbr")).on
    assert not resolve_slow_start("auto", None, n, host(tcp_slow_start_after_idle=0,
                                                        tcp_congestion_control="cubic")).on
    assert not resolve_slow_start("auto", None, n, None).on
    assert resolve_slow_start("on", 4, n).connections == 4
    assert not resolve_slow_start("on", None, None).on  # not a TCP transport (infiniband)
    assert not Network(System(nic_kind="infiniband", latency_s=0.02, tcp_slow_start_after_idle="on"),
                       2).slow_start.on
    # the segment is the one of the ethernet kind's framing efficiency
    assert NIC_KINDS["ethernet"].efficiency == M / 1538


def test_connections_split_the_message_and_the_rate():
    """c connections each carry S / c at rate / c from their own initial window."""
    one, four = SlowStart(True, 1), SlowStart(True, 4)
    assert four.delay(8e6, 400e6, 0.04, 10, 10.0)[0] == pytest.approx(
        slow_start_delay(2e6, 100e6, 0.04, 10)[0])
    assert one.delay(8e6, 400e6, 0.04, None, None)[0] == 0.0  # no history: a full window
    # a message without bytes leaves the window as it was (no history stays no history)
    assert one.delay(0, 400e6, 0.04, None, 10.0) == (0.0, None)
    assert slow_start_delay(1e6, 100e6, 0.04, 0)[0] == slow_start_delay(1e6, 100e6, 0.04, 1)[0]


def test_bad_values_are_one_line_errors():
    with pytest.raises(ConfigError, match="tcp_slow_start_after_idle") as err:
        System(tcp_slow_start_after_idle="sometimes")
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="tcp_slow_start_after_idle"):
        predict(latency="40ms", tcp_slow_start_after_idle="maybe")
    r = run_cli_here("predict", "--latency", "40ms", "--tcp-slow-start-after-idle", "maybe")
    assert r.returncode == 2 and "--tcp-slow-start-after-idle" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_effect_script_counts_one_restart_per_gpipe_hop_and_direction(capsys):
    """scripts/tcp_idle_effect.py (docs/validation.md's table): on the README's 8-stage GPipe
    pipeline each of the 7 forward and 7 backward connections restarts once per iteration, and
    the seconds those restarts add are the iteration's growth (they sit on the fill's critical path)."""
    path = Path(__file__).resolve().parents[2] / "scripts" / "tcp_idle_effect.py"
    spec = importlib.util.spec_from_file_location("tcp_idle_effect", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--bandwidth", "100Mbps", "--rtt", "50ms"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("  100Mbps")]
    assert [r[2] for r in rows] == ["fp32", "aqsgd:fw3bw6"]
    for r in rows:
        off, on, restarts, added = float(r[3]), float(r[4]), int(r[6]), float(r[7])
        assert restarts == 14 and on - off == pytest.approx(added, rel=0.05)
    assert mod.main(["--schedule", "bogus"]) == 2
    assert "schedule" in capsys.readouterr().err
