"""A TCP connection's window over a long link (perfsim.tcp): where the ceiling binds, connections,
``off``, bad values, and the calibrated host's sysctls."""

import json
import math
from pathlib import Path

import pytest

from perfsim import sweep
from perfsim.api import build_configs, predict
from perfsim.config import System
from perfsim.engine import simulate
from perfsim.errors import ConfigError
from perfsim.network.analytic import Network
from perfsim.plan import SearchSpace, plan
from perfsim.tcp import LINUX_DEFAULTS, TcpHost, parse_tcp_window, read_host, resolve

from _helpers import run_cli, run_cli_here

ROOT = Path(__file__).resolve().parents[2]
MIB = 2**20
#: Linux's default window: min(tcp_wmem 4 MiB, 1/2 x tcp_rmem 6 MiB)
W = 3 * MIB


def _net(**system) -> Network:
    return Network(System(**{"nic_kind": "ethernet", **system}), 2)


def test_linux_default_window_is_min_of_send_buffer_and_advertised_share():
    assert LINUX_DEFAULTS.payload_share == 0.5 and LINUX_DEFAULTS.window_bytes == W
    # a big receive buffer: the send buffer binds; tcp_adv_win_scale 2 advertises 3/4, -1 a half
    assert TcpHost(32 * MIB, 4 * MIB).window_bytes == 4 * MIB
    assert TcpHost(8 * MIB, 16 * MIB, adv_win_scale=2).window_bytes == 6 * MIB
    assert TcpHost(8 * MIB, 16 * MIB, adv_win_scale=-1).window_bytes == 4 * MIB
    assert TcpHost(8 * MIB, 16 * MIB, window_scaling=False).window_bytes == 65535


def test_cap_binds_exactly_when_window_per_round_trip_is_below_the_rate():
    """80 ms of round trip: 3 MiB x 8 / 0.08 s = 314.6 Mbit/s binds a 1 Gbps link and not a
    100 Mbps one; no latency, no ceiling."""
    cap = W * 8 / 0.080
    fast, slow = _net(bandwidth_bps=1e9, latency_s=0.040), _net(bandwidth_bps=1e8, latency_s=0.040)
    assert fast.link.rate_bps > cap > slow.link.rate_bps
    assert fast.path(0, 1).bandwidth_bps == pytest.approx(cap, rel=1e-12)
    assert slow.path(0, 1).bandwidth_bps == slow.link.rate_bps
    assert _net(bandwidth_bps=1e9).path(0, 1).bandwidth_bps == fast.link.rate_bps
    # the NIC's capacity is not the connection's: other peers' connections still share all of it
    assert fast.capacity(("tx", 0)) == fast.link.rate_bps
    # predict: the 1 Gbps iteration slows, the 100 Mbps one is the same to the bit
    for bw, binds in (("1Gbps", True), ("100Mbps", False)):
        kw = dict(bandwidth=bw, latency="40ms", pp=2, dp=2)
        on, off = predict(**kw).summary, predict(**kw, tcp_window="off").summary
        assert (on["iteration_s"] > off["iteration_s"]) is binds
        assert (on["dp_sync_s"] > off["dp_sync_s"]) is binds  # collectives' hops too
        if not binds:
            assert on["iteration_s"] == off["iteration_s"] and on["comm_s"] == off["comm_s"]
        assert on["tcp_rate_cap_bps"] == pytest.approx(cap) and off["tcp_rate_cap_bps"] is None


def test_connections_multiply_the_ceiling():
    one = _net(bandwidth_bps=10e9, latency_s=0.040).path(0, 1).bandwidth_bps
    four = _net(bandwidth_bps=10e9, latency_s=0.040, tcp_connections=4).path(0, 1).bandwidth_bps
    assert four == pytest.approx(4 * one) and four < 10e9
    # NCCL's socket transport is TCP too; InfiniBand and the ideal NIC are not
    assert _net(bandwidth_bps=10e9, latency_s=0.04, nic_kind="socket").path(0, 1).bandwidth_bps == one
    for kind in ("infiniband", "ideal"):
        net = _net(bandwidth_bps=10e9, latency_s=0.04, nic_kind=kind)
        assert net.path(0, 1).bandwidth_bps == net.link.rate_bps and net.tcp.window_bytes is None


def test_off_gives_the_uncapped_times_bit_for_bit():
    """``off``, a window too large to bind and no latency at all give the same figures to the bit,
    in the closed-form replay and in the event loop."""
    base = dict(model="gpt:layers=4,hidden=256,heads=4,seq=128,vocab=1000", pp=2, dp=2, macro_batch=4,
                bandwidth="1Gbps", latency="40ms")
    off = build_configs(**base, tcp_window="off")
    huge = build_configs(**base, tcp_window="1GiB")
    capped = build_configs(**base)
    for replay in (True, False):
        a, b, c = (simulate(*cfg, replay=replay).summary for cfg in (off, huge, capped))
        for key in ("iteration_s", "comm_s", "dp_sync_s", "idle_s", "total_s"):
            assert a[key] == b[key], key
        assert c["iteration_s"] > a["iteration_s"]
    zero = dict(base, latency="0s")
    s_auto, s_off = predict(**zero).summary, predict(**zero, tcp_window="off").summary
    assert {k: s_auto[k] for k in ("iteration_s", "comm_s", "dp_sync_s")} == \
        {k: s_off[k] for k in ("iteration_s", "comm_s", "dp_sync_s")}


@pytest.mark.parametrize("kw,culprit", [
    (dict(tcp_window=-1), "tcp_window"), (dict(tcp_window=0), "tcp_window"),
    (dict(tcp_window="sometimes"), "tcp_window"), (dict(tcp_window="0B"), "tcp_window"),
    (dict(tcp_connections=0), "tcp_connections"), (dict(tcp_connections=1.5), "tcp_connections"),
])
def test_bad_values_are_one_line_config_errors(kw, culprit):
    with pytest.raises(ConfigError, match=culprit) as err:
        predict(latency="40ms", **kw)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("args,culprit", [(["--tcp-window", "sometimes"], "--tcp-window"),
                                          (["--tcp-window=-3MiB"], "--tcp-window"),
                                          (["--tcp-connections", "0"], "--tcp-connections")])
def test_cli_bad_values_exit_2(args, culprit):
    # the first row in a fresh interpreter, the others through perfsim.cli.main in this one
    r = (run_cli if args[0] == "--tcp-window" and args[1] == "sometimes" else run_cli_here)(
        "predict", "--latency", "40ms", *args)
    assert r.returncode == 2 and culprit in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_parse_tcp_window_words_and_sizes():
    assert parse_tcp_window(" AUTO ") == "auto" and parse_tcp_window("off") == "off"
    assert parse_tcp_window("16MiB") == 16 * MIB and parse_tcp_window(65535) == 65535
    assert resolve("off", None, 1).window_bytes is None
    assert resolve("2MiB", 3, 1).rate_cap_bps(0.1) == pytest.approx(3 * 2 * MIB * 8 / 0.1)
    assert math.isinf(resolve("auto", None, 1).rate_cap_bps(0.0))


def test_profile_sysctls_are_used_when_present(tmp_path):
    """A profile that recorded its host's sysctls (calibrate --comm: metadata.tcp) gives the
    window; one without gives Linux's defaults -- and says which. The calibrated link (the
    shipped CPU profile measured 1 Gbps) is capped like a nominal one."""
    data = json.loads((ROOT / "traces" / "cpu-2core.json").read_text())
    assert "tcp" not in data["metadata"]
    data["metadata"]["tcp"] = {"tcp_rmem": [4096, 131072, 32 * MIB], "tcp_wmem": [4096, 16384, 4 * MIB],
                               "tcp_adv_win_scale": 1, "tcp_window_scaling": 1, "kernel": "Linux 6.18"}
    path = tmp_path / "host.json"
    path.write_text(json.dumps(data))
    kw = dict(model="gpt2-tiny", pp=1, dp=2, bandwidth="1Gbps", latency="40ms")
    plain = predict(profile=str(ROOT / "traces" / "cpu-2core.json"), **kw).summary
    host = predict(profile=str(path), **kw).summary
    assert plain["tcp_window_bytes"] == W and "Linux defaults" in plain["tcp_window_source"]
    assert host["tcp_window_bytes"] == 4 * MIB and "host" in host["tcp_window_source"]
    assert "profile" in host["link_source"]  # the measured link, capped at 4 MiB / 80 ms
    assert host["tcp_rate_cap_bps"] == pytest.approx(4 * MIB * 8 / 0.08)
    off = predict(profile=str(path), tcp_window="off", **kw).summary
    assert off["dp_sync_s"] < host["dp_sync_s"] < plain["dp_sync_s"]  # 6.7 MB of gradients
    # a malformed record is the profile's error, in one line
    data["metadata"]["tcp"] = {"tcp_rmem": "big"}
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="metadata.tcp"):
        predict(profile=str(path), **kw)


def test_read_host_reads_proc(tmp_path):
    for name, text in (("tcp_rmem", "4096 131072 6291456"), ("tcp_wmem", "4096\t16384\t4194304"),
                       ("tcp_adv_win_scale", "1"), ("tcp_congestion_control", "cubic")):
        (tmp_path / name).write_text(text + "\n")
    rec = read_host(tmp_path)
    assert rec["tcp_rmem"] == [4096, 131072, 6291456] and rec["tcp_wmem"][2] == 4194304
    assert rec["tcp_congestion_control"] == "cubic" and "tcp_window_scaling" not in rec
    assert read_host(tmp_path / "missing") is None


def test_plan_and_sweep_see_the_window():
    """perfsim plan (its bounds and its simulations read the same Network paths) and perfsim sweep
    take the flags from params.PARAMS like predict."""
    space = SearchSpace(schedules=("gpipe",), compress=("fp32",), grad_compress=("none",))
    common = dict(model="gpt2-xl", nodes=2, global_batch=8, bandwidth="1Gbps", latency="40ms", space=space, top=2)
    off, on = plan(tcp_window="off", **common), plan(**common)
    assert on.ranked[0].summary["iteration_s"] > off.ranked[0].summary["iteration_s"]
    assert all(c.summary["tcp_window_bytes"] == W for c in on.ranked)
    table = sweep(bandwidth="1Gbps", latency="40ms", tcp_window=["auto", "off", "16MiB"], pp=2, dp=2).summary
    its = table["iteration_s"].tolist()
    assert its[0] > its[1] == its[2]  # 16 MiB / 80 ms = 1.68 Gbit/s: above the link, as off


def test_predict_table_says_when_the_window_binds():
    on = run_cli_here("predict", "--bandwidth", "1Gbps", "--latency", "40ms", "--pp", "2")
    assert on.returncode == 0, on.stderr
    text = " ".join(on.stdout.split())  # the console wraps long lines
    assert "tcp window: 3 MiB x 1 connection" in text
    assert "at most 314.573Mbps per message over the 80 ms round trip" in text
    for args in (["--bandwidth", "100Mbps"], ["--bandwidth", "1Gbps", "--tcp-window", "off"]):
        r = run_cli_here("predict", *args, "--latency", "40ms", "--pp", "2")
        assert r.returncode == 0 and "tcp window" not in r.stdout


def test_topology_pairs_use_their_own_round_trip(tmp_path):
    """On a topology each pair's latency gives its round trip: a 40 ms pair is capped, a 1 ms one not."""
    topo = tmp_path / "topo.json"
    topo.write_text(json.dumps({"nodes": 3, "bandwidth": "10Gbps", "latency": "40ms",
                                "links": [{"src": 0, "dst": 1, "bandwidth": "10Gbps", "latency": "1ms"}]}))
    _, _, system, profile = build_configs(model="gpt2-tiny", pp=3, topology=str(topo))
    net = Network(system, 3, profile)
    assert net.path(0, 2).bandwidth_bps == pytest.approx(W * 8 / 0.080)
    assert net.path(0, 1).bandwidth_bps == pytest.approx(10e9 * net.link.efficiency)
