"""Network: collective closed forms, topology files, fair sharing of NICs."""

import json

import pytest
import simpy

from perfsim.config import System
from perfsim.errors import ConfigError
from perfsim.network import Network, collective_cost, collective_time, load_topology
from perfsim.network.flows import FlowScheduler


def test_collective_closed_forms():
    S, B, lat = 1e6, 1e9, 1e-3
    for n in (2, 5, 16):
        assert collective_time("allreduce", S, n, B, lat) == pytest.approx(
            2 * (n - 1) / n * S * 8 / B + 2 * (n - 1) * lat)
        assert collective_cost("allgather", S, n) == ((n - 1) * S, n - 1)
        assert collective_cost("alltoall", S, n)[0] == pytest.approx((n - 1) / n * S)
    assert collective_cost("allreduce", S, 1) == (0.0, 0)
    assert collective_cost("p2p", S, 2) == (S, 1)


def test_intra_node_faster():
    net = Network(System(bandwidth_bps=1e9, latency_s=1e-3, gpus_per_node=2), 4)
    assert net.path(0, 1).bandwidth_bps > net.path(1, 2).bandwidth_bps
    assert net.path(0, 1).resources == () and net.path(1, 2).resources == (("tx", 0), ("rx", 1))
    assert net.p2p_time(1, 2, 1e6) == pytest.approx(1e-3 + 8e-3)


def test_ring_collective_uses_slowest_link(write_file):
    f = write_file("t.json", json.dumps({"nodes": 3, "bandwidth": "1Gbps", "latency": "1ms",
                                         "links": [{"src": 1, "dst": 2, "bandwidth": "100Mbps", "latency": "20ms",
                                                    "symmetric": False}]}))
    topo = load_topology(f)
    net = Network(System(topology=topo), 3)
    S = 1e6
    assert net.collective_time("allreduce", S, [0, 1, 2]) == pytest.approx(
        2 * 2 / 3 * S * 8 / 1e8 + 4 * 0.02)
    assert net.path(2, 1).bandwidth_bps == 1e9


def test_topology_formats_agree(tmp_path):
    (tmp_path / "t.csv").write_text("src,dst,bandwidth,latency\n0,1,100Mbps,10ms\n0,2,1Gbps,1ms\n1,2,1Gbps,1ms\n")
    (tmp_path / "t.toml").write_text('bandwidth_matrix = [[0, "100Mbps", "1Gbps"], ["100Mbps", 0, "1Gbps"], '
                                     '["1Gbps", "1Gbps", 0]]\nlatency_matrix = [[0, "10ms", "1ms"], '
                                     '["10ms", 0, "1ms"], ["1ms", "1ms", 0]]\n')
    a, b = load_topology(tmp_path / "t.csv"), load_topology(tmp_path / "t.toml")
    assert a.bandwidth == b.bandwidth
    assert [x for row in a.latency for x in row] == pytest.approx([x for row in b.latency for x in row])
    assert not a.is_uniform()


@pytest.mark.parametrize("name,text,msg", [
    ("a.json", "{", "malformed"),
    ("a.json", '{"nodes": 2}', "bandwidth"),
    ("a.json", '{"nodes": 2, "bandwidth": "-1Gbps"}', "positive"),
    ("a.json", '{"nodes": 2, "bandwidth": "1Gbps", "colour": 1}', "colour"),
    ("a.json", '{"bandwidth_matrix": [[0, 1], [1]]}', "row 1"),
    ("a.csv", "src,dst,bandwidth,latency\n0,1,1Gbps,0\n0,2,1Gbps,0\n", "pair 1,2"),
    ("a.csv", "a,b\n1,2\n", "header"),
    # qa3: a pair given twice took its last row silently (1 Gbps then 10 Mbps: ran at 10 Mbps)
    ("a.csv", "src,dst,bandwidth,latency\n0,1,1Gbps,0\n0,1,10Mbps,0\n", "row 3: the pair 0,1 again.*row 2"),
    ("a.toml", 'nodes = 2\nbandwidth = "1Gbps"\n[[links]]\nsrc = 0\ndst = 1\nbandwidth = "1Gbps"\n'
               '[[links]]\nsrc = 0\ndst = 1\nbandwidth = "10Mbps"\n', r"links\[1\]: the pair 0,1 again.*links\[0\]"),
])
def test_bad_topologies(tmp_path, name, text, msg):
    f = tmp_path / name
    f.write_text(text)
    with pytest.raises(ConfigError, match=msg):
        load_topology(f)


def test_topology_too_small(write_file):
    f = write_file("t.json", '{"nodes": 2, "bandwidth": "1Gbps"}')
    with pytest.raises(ConfigError, match="needs 4"):
        Network(System(topology=load_topology(f)), 4)


def _run_flows(specs, capacity):
    env = simpy.Environment()
    fs = FlowScheduler(env, capacity)
    ends = {}

    def start(name, at, nbytes, res, cap):
        yield env.timeout(at)
        yield fs.transfer(nbytes, res, cap)
        ends[name] = env.now

    for name, at, nbytes, res, cap in specs:
        env.process(start(name, at, nbytes, res, cap))
    env.run()
    return ends


def test_fair_sharing_of_a_nic():
    # two 1 MB flows out of one 8 Mbit/s NIC: together they take 2 s
    ends = _run_flows([("a", 0, 1e6, [("tx", 0)], 1e12), ("b", 0, 1e6, [("tx", 0)], 1e12)], lambda r: 8e6)
    assert ends == pytest.approx({"a": 2.0, "b": 2.0})
    # staggered: b arrives at 0.5 s when a has 0.5 MB left; shares, a ends at 1.5, b at 2
    ends = _run_flows([("a", 0, 1e6, [("tx", 0)], 1e12), ("b", 0.5, 1e6, [("tx", 0)], 1e12)], lambda r: 8e6)
    assert ends == pytest.approx({"a": 1.5, "b": 2.0})


def test_max_min_with_caps():
    # a is capped at 2 Mbit/s; b gets the rest (6 Mbit/s) of the shared 8 Mbit/s NIC
    ends = _run_flows([("a", 0, 1e6, [("tx", 0)], 2e6), ("b", 0, 1.5e6, [("tx", 0)], 1e12)], lambda r: 8e6)
    assert ends["a"] == pytest.approx(4.0)
    assert ends["b"] == pytest.approx(2.0)


def test_regional_topology(tmp_path, write_file):
    f = write_file("geo.toml", 'nodes = 6\nregions = {size = 3}\n'
                               'region_bandwidth = [["10Gbps", "100Mbps"], ["100Mbps", "10Gbps"]]\n'
                               'region_latency = [["1ms", "40ms"], ["40ms", "1ms"]]\n'
                               '[[links]]\nsrc = 0\ndst = 1\nbandwidth = "50Mbps"\n')
    topo = load_topology(f)
    assert topo.nodes == 6 and not topo.is_uniform()
    assert topo.link(0, 1) == (5e7, 1e-3) and topo.link(1, 0) == (5e7, 1e-3)
    assert topo.link(1, 2) == (1e10, 1e-3)
    assert topo.link(2, 3) == pytest.approx((1e8, 0.04))
    (tmp_path / "bad.json").write_text('{"regions": [0, 1], "region_bandwidth": [["1Gbps"]]}')
    with pytest.raises(ConfigError, match="2 x 2"):
        load_topology(tmp_path / "bad.json")


def test_topology_rows_carry_the_topology_links_and_reject_bandwidth(write_file):
    """Topology rows said 1e10 bit/s, 0 s (the unused --bandwidth/--latency)."""
    from perfsim.api import predict

    f = write_file("t.toml", 'nodes = 4\nbandwidth = "1Gbps"\nlatency = "2ms"\n'
                             '[[links]]\nsrc = 0\ndst = 1\nbandwidth = "100Mbps"\nlatency = "30ms"\n')
    s = predict(topology=str(f), pp=4, macro_batch=4).summary
    assert s["topology"] == str(f) and s["bandwidth_bps"] == 1e8 and s["latency_s"] == pytest.approx(0.03)
    with pytest.raises(ConfigError, match="replace bandwidth"):
        predict(topology=str(f), bandwidth="10Gbps", pp=4)


def test_topology_nic_default_matches_bandwidth(write_file):
    """A topology file's NIC was unlimited while --bandwidth shares it, so two
    descriptions of one cluster disagreed. Now they give the same answer."""
    from perfsim.api import predict

    f = write_file("t.toml", 'nodes = 2\nbandwidth = "100Mbps"\nlatency = "0s"\n')
    common = dict(pp=2, dp=2, gpus_per_node=2, macro_batch=8, grad_compress="none")
    for schedule in ("gpipe", "1f1b"):
        by_flag = predict(bandwidth="100Mbps", schedule=schedule, **common).summary["iteration_s"]
        by_file = predict(topology=str(f), schedule=schedule, **common).summary["iteration_s"]
        assert by_file == pytest.approx(by_flag, rel=1e-9)


def test_one_gpus_flows_use_its_own_nics():
    """8 GPUs and 8 x 200 Gb/s NICs per node (DGX A100): a lone pipeline message and a ring
    with one rank per node get one NIC (nic_affinity gpu), a ring with 8 ranks per node all
    eight (a ring per NIC); ``node`` gives every flow the node's 1.6 Tb/s (the earlier model)."""
    kw = dict(bandwidth_bps=8 * 200e9, gpus_per_node=8, nics_per_node=8)
    net, old = Network(System(**kw), 16), Network(System(**kw, nic_affinity="node"), 16)
    assert net.path(0, 8).bandwidth_bps == pytest.approx(200e9)
    assert old.path(0, 8).bandwidth_bps == pytest.approx(1.6e12)
    assert net.path(0, 1) == old.path(0, 1)  # inside the node: the fabric
    assert net.capacity(("tx", 0)) == pytest.approx(1.6e12)  # the node's NICs, shared max-min
    assert net.group_shape([0, 8]).inter_bps == pytest.approx(200e9)
    assert net.group_shape(list(range(16))).inter_bps == pytest.approx(1.6e12)
    assert old.group_shape([0, 8]).inter_bps == pytest.approx(1.6e12)
    # 2 NICs for 8 GPUs: a GPU reaches one of them; 1 NIC: all of it; 8 NICs for 4 GPUs: 2 each
    assert Network(System(bandwidth_bps=2e11, gpus_per_node=8, nics_per_node=2), 16).path(0, 8).bandwidth_bps == 1e11
    assert Network(System(bandwidth_bps=2e11, gpus_per_node=8), 16).path(0, 8).bandwidth_bps == 2e11
    assert Network(System(bandwidth_bps=8e11, gpus_per_node=4, nics_per_node=8), 8).path(0, 4).bandwidth_bps == 2e11
    with pytest.raises(ConfigError, match="nic_affinity='rail'"):
        System(nic_affinity="rail")


def test_pipeline_message_across_nodes_is_one_nics_worth():
    """pp 4 on two nodes of 2 GPUs and 2 NICs (stages 1 -> 2 cross): each activation crosses
    at one NIC's rate, not at both NICs' together; the bytes do not change."""
    from perfsim.api import predict

    kw = dict(model="gpt2", gpu="a100", pp=4, dp=1, gpus_per_node=2, nic="2x100Gbps:ideal",
              micro_batch=4, global_batch=32)
    one, both = predict(**kw), predict(**kw, nic_affinity="node")
    assert one.summary["pipeline_bytes"] == both.summary["pipeline_bytes"]
    msg = one.summary["pipeline_bytes"] / (3 * 2 * 8)  # 3 boundaries, fwd + bwd, 8 micro-batches
    assert msg == 4 * 1024 * 768 * 4  # micro-batch x seq x hidden, fp32
    extra = msg * 8 / 100e9 - msg * 8 / 200e9  # one message's extra time on one NIC
    slower = one.summary["iteration_s"] - both.summary["iteration_s"]
    assert 2 * extra * 0.99 <= slower <= 2 * 8 * extra * 1.01  # the 16 crossing messages: between once and all on the critical path


def test_nccl_socket_transport_is_host_bound():
    """NCCL's socket transport (TCP, no RDMA): TCP framing on slow links, a 5 GB/s per-node
    ceiling of the proxy threads' copies on fast ones (NVIDIA/nccl#450: 4-6 GB/s on 100 Gb/s)."""
    from perfsim.fabrics import NIC_KINDS, parse_nic

    sock = NIC_KINDS["socket"]
    assert sock.efficiency_at(10e9) == pytest.approx(1448 / 1538)
    assert sock.efficiency_at(100e9) == pytest.approx(0.4)
    assert NIC_KINDS["ethernet"].efficiency_at(100e9) == pytest.approx(1448 / 1538)
    assert parse_nic("2x100Gbps:socket").kind == "socket"
    net = Network(System(bandwidth_bps=100e9, gpus_per_node=8, nic_kind="socket"), 16)
    assert net.collective_link.rate_bps == pytest.approx(40e9)
    assert Network(System(bandwidth_bps=40e9, nic_kind="socket"), 2).link.rate_bps == pytest.approx(40e9 * 1448 / 1538)


@pytest.mark.parametrize("text, culprit", [
    ('nodes = 2\nbandwidth = 100\n', "bandwidth"),                                   # ran at 100 bit/s
    ('nodes = 2\nbandwidth = "1Gbps"\nlatency = 5\n', "latency"),                     # ran with 5 s
    ('bandwidth_matrix = [[0, "1Gbps"], ["1Gbps", 0]]\nlatency_matrix = [[0, 0.05], [0.05, 0]]\n',
     r"latency_matrix\[0\]\[1\]"),
    ('nodes = 2\nbandwidth = "1Gbps"\nnic_bandwidth = 10\n', "nic_bandwidth"),
    ('nodes = 2\nbandwidth = "1Gbps"\n[[links]]\nsrc = 0\ndst = 1\nbandwidth = 100\n', r"links\[0\]\.bandwidth"),
    ('regions = [0, 1]\nregion_bandwidth = [["1Gbps", 200], [200, "1Gbps"]]\n', r"region_bandwidth\[0\]\[1\]"),
])
def test_a_topology_files_numbers_need_units(tmp_path, text, culprit):
    """A topology file's `bandwidth = 100` was 100 bit/s and `latency = 5` 5 s, silently (an
    iteration of 49 hours): a file mirrors the flags as a sweep file does, so a rate or a time
    written as a number without its unit is refused, naming the key and a way to write it.
    Zero (a latency, the ignored diagonal) needs none; Python dicts keep SI numbers."""
    f = tmp_path / "t.toml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=culprit) as err:
        load_topology(f)
    assert "no unit" in str(err.value) and "\n" not in str(err.value)
    from perfsim.network import topology_from_dict

    f.write_text('nodes = 2\nbandwidth = "1Gbps"\nlatency = 0\nlatency_matrix = [[0, "5ms"], ["5ms", 0]]\n')
    assert load_topology(f).latency[0][1] == pytest.approx(0.005)
    assert topology_from_dict({"nodes": 2, "bandwidth": 1e9, "latency": 0.005}).bandwidth[0][1] == 1e9
