"""Schedule tables: whole orderings (golden), torch.distributed.pipelining's own
orders, explicit communication, held work (memory), bad input."""

import types

import pytest

from perfsim.errors import ConfigError
from perfsim.schedules import (Action, Table, build_table, check_table, comm_channel, format_table,
                               get_schedule, gpipe, held_work, max_in_flight, one_f_one_b, with_comms)


def rows(table):
    return [" ".join(map(str, r)) for r in table]


def test_interleaved_golden():
    t = get_schedule("interleaved-1f1b")(2, 4, 2)
    assert t.stage_device == (0, 1, 0, 1) and t.virtual_stages == 2
    assert rows(t) == [
        "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3",
        "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3",
    ]


def test_zb_h1_golden():
    t = get_schedule("zb-h1")(3, 4)
    assert rows(t) == [
        "0F0 0F1 0F2 0I0 0W0 0F3 0I1 0W1 0I2 0W2 0I3 0W3",
        "1F0 1F1 1I0 1F2 1I1 1W0 1F3 1I2 1W1 1I3 1W2 1W3",
        "2F0 2I0 2F1 2I1 2F2 2I2 2W0 2F3 2I3 2W1 2W2 2W3",
    ]
    assert t.splits_backward


def test_zb_v_golden():
    t = get_schedule("zb-v")(2, 3)
    assert t.stage_device == (0, 1, 1, 0) and t.stages_of(0) == [0, 3]
    assert rows(t) == [
        "0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0I0 0W0 3F2 3I2 3W2 0I1 0W1 0I2 0W2",
        "1F0 2F0 1F1 2F1 2I0 2W0 1F2 1I0 1W0 2F2 2I1 2W1 1I1 2I2 1I2 1W1 2W2 1W2",
    ]


def test_with_comms_golden():
    """Explicit sends/receives; a boundary inside a device (zb-v's 1 -> 2) is a local hand-off."""
    assert rows(with_comms(get_schedule("zb-v")(2, 2))) == [
        "0F0 0SEND_F0 0F1 0SEND_F1 3RECV_F0 3F0 3I0 3SEND_B0 3W0 3RECV_F1 3F1 3I1 3SEND_B1 3W1 "
        "0RECV_B0 0I0 0W0 0RECV_B1 0I1 0W1",
        "1RECV_F0 1F0 2F0 2SEND_F0 1RECV_F1 1F1 2F1 2SEND_F1 2RECV_B0 2I0 2W0 1I0 1SEND_B0 1W0 "
        "2RECV_B1 2I1 2W1 1I1 1SEND_B1 1W1",
    ]
    assert comm_channel(Action.parse("3RECV_F0")) == (2, "F")
    assert comm_channel(Action.parse("1SEND_B0")) == (0, "B")


@pytest.mark.parametrize("name,v", [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2),
                                    ("interleaved-1f1b", 3), ("zb-h1", 1), ("zb-v", 2)])
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 4), (4, 3), (3, 6), (1, 3)])
def test_tables_complete_and_runnable(name, v, p, m):
    if name == "interleaved-1f1b" and m > p and m % max(1, m // p):
        pytest.skip("not a whole number of rounds")
    t = get_schedule(name)(p, m, v)
    check_table(t)  # every action once, on its device, no deadlock
    comms = with_comms(t)  # every channel FIFO-consistent
    for d, row in enumerate(comms):
        assert [a for a in row if a.is_compute] == t[d]


TORCH = [("interleaved-1f1b", "ScheduleInterleaved1F1B", 2), ("interleaved-1f1b", "ScheduleInterleaved1F1B", 3),
         ("zb-h1", "ScheduleInterleavedZeroBubble", 1), ("zb-v", "ScheduleZBVZeroBubble", 2)]


@pytest.mark.parametrize("name,cls,v", TORCH)
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (8, 32), (4, 4), (4, 3), (2, 6), (4, 12)])
def test_same_order_as_torch(name, cls, v, p, m):
    """torch.distributed.pipelining computes its pipeline_order from recording stages
    (only the attributes the schedule reads); every rank's compute actions match."""
    torch = pytest.importorskip("torch")
    sched = pytest.importorskip("torch.distributed.pipelining.schedules")
    klass = getattr(sched, cls, None)
    if klass is None:
        pytest.skip(f"torch {torch.__version__} has no {cls}")
    n = p * v
    stages = [types.SimpleNamespace(group_size=p, group_rank=0, num_stages=n, stage_index=k, is_first=k == 0,
                                    is_last=k == n - 1, submod=torch.nn.Linear(1, 1)) for k in range(v)]
    order = klass(stages, m, loss_fn=lambda out, target: out).pipeline_order
    ours = get_schedule(name)(p, m, v)
    for d in range(p):
        assert [str(a) for a in ours[d]] == [str(a) for a in order[d] if a is not None], f"rank {d}"
    if name == "zb-v":
        from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping

        assert ours.stage_device == tuple(generate_stage_to_rank_mapping(p, n, style="v")[k] for k in range(n))


@pytest.mark.parametrize("p,m", [(4, 8), (4, 2), (8, 32)])
def test_held_work(p, m):
    """Peak micro-batches held per device: GPipe m, 1F1B min(m, p-d), ZB-H1 the first
    stage's min(m, p) everywhere, with up to d+1 pending W on device d (arXiv:2401.10241 Sec. 3.1);
    interleaved (V-1)*mpr + 2(p-1-d) + 1 chunk activations (Megatron's warm-up + 1)."""
    held = lambda name, v=None: [(h.activations, h.weight_grads) for h in held_work(get_schedule(name)(p, m, v))]  # noqa: E731
    assert held("gpipe") == [(m, 0)] * p
    assert held("1f1b") == [(min(m, p - d), 0) for d in range(p)]
    assert held("zb-h1") == [(min(m, p), min(d + 1, m)) for d in range(p)]
    mpr = m // max(1, m // p)
    assert held("interleaved-1f1b", 2) == [(min(2 * m, mpr + 2 * (p - 1 - d) + 1), 0) for d in range(p)]
    zbv = held_work(get_schedule("zb-v")(p, m))
    assert all(h.stage_fraction == 0.5 for h in zbv)
    assert [h.activations for h in zbv] == [max_in_flight(r) for r in get_schedule("zb-v")(p, m)]
    if m >= 2 * p:  # ZB-V: 2p chunk activations = p full stages, as 1F1B's first stage
        assert max(h.activations for h in zbv) == 2 * p


def test_bad_input_named():
    with pytest.raises(ConfigError, match="virtual_stages=3: zb-v"):
        build_table("zb-v", 4, 8, 3)
    with pytest.raises(ConfigError, match="virtual_stages=2: schedule '1f1b'"):
        build_table("1f1b", 4, 8, 2)
    with pytest.raises(ConfigError, match="num_microbatches=9: interleaved-1f1b"):
        build_table("interleaved-1f1b", 4, 9, 2)
    with pytest.raises(ConfigError, match="schedule 'zb-h2'"):
        get_schedule("zb-h2")
    with pytest.raises(ConfigError, match="action 'zz'"):
        Action.parse("zz")
    assert Action.parse("12SEND_B7") == Action(12, "SEND_B", 7)


def test_check_table_finds_deadlock_and_gaps():
    a = Action.parse
    dead = Table(((a("0F0"), a("0B0")), (a("1B0"), a("1F0"))), (0, 1), 1, "bad")
    with pytest.raises(ConfigError, match="deadlock"):
        check_table(dead)
    gap = Table(((a("0F0"),), (a("1F0"), a("1B0"))), (0, 1), 1, "gap")
    with pytest.raises(ConfigError, match="stage 0 backward"):
        check_table(gap)
    assert format_table(gap) == "stage 0: 0F0\nstage 1: 1F0 1B0"


def test_runtime_posts_receives_from_the_comm_rows():
    """The runtime's receive posting (StageRunner.inbound: peer, channel, order) is read
    from with_comms, and matches what the peer rank sends on that channel, in order."""
    torch = pytest.importorskip("torch")
    from perfsim.runtime.pipeline import StageRunner, channel_of

    table = get_schedule("interleaved-1f1b")(2, 4, 2)
    runners = [StageRunner({}, table, d, lambda dev: 10 + dev,
                           {k: {"fw_recv": f"fw{k}", "bw_recv": f"bw{k}"} for k in table.stages_of(d)},
                           None, 1, torch.device("cpu")) for d in range(2)]
    sent = {}
    for d, r in enumerate(runners):
        for a in r.actions:
            if a.kind.startswith("SEND"):
                sent.setdefault((10 + d, channel_of(*comm_channel(a))), []).append(a.microbatch)
    got = {}
    for d, r in enumerate(runners):
        for (stage, direction), ch in r.inbound.items():
            assert ch.peer == 10 + (1 - d)
            assert ch.comp == (f"fw{stage}" if direction == "F" else f"bw{stage}")
            got[(ch.peer, ch.channel)] = ch.order
    assert got == sent
    assert sorted(ch for _, ch in got) == [0, 1, 2, 3, 4, 5]  # 3 boundaries x 2 directions


def test_gpipe_golden():
    assert format_table(gpipe(2, 3)) == (
        "stage 0: 0F0 0F1 0F2 0B0 0B1 0B2\n"
        "stage 1: 1F0 1F1 1F2 1B0 1B1 1B2")


def test_1f1b_golden():
    assert format_table(one_f_one_b(4, 6)) == (
        "stage 0: 0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0B3 0B4 0B5\n"
        "stage 1: 1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1F5 1B3 1B4 1B5\n"
        "stage 2: 2F0 2F1 2B0 2F2 2B1 2F3 2B2 2F4 2B3 2F5 2B4 2B5\n"
        "stage 3: 3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5")


@pytest.mark.parametrize("p,m", [(1, 1), (2, 1), (3, 2), (4, 8), (8, 32), (5, 3)])
def test_schedules_complete_and_bounded(p, m):
    for table in (gpipe(p, m), one_f_one_b(p, m)):
        for s, row in enumerate(table):
            assert sorted(row) == sorted([Action(s, "F", i) for i in range(m)] + [Action(s, "B", i) for i in range(m)])
            # a micro-batch's backward never precedes its forward
            seen = set()
            for a in row:
                if a.kind == "F":
                    seen.add(a.microbatch)
                else:
                    assert a.microbatch in seen
    assert [max_in_flight(r) for r in gpipe(p, m)] == [m] * p
    assert [max_in_flight(r) for r in one_f_one_b(p, m)] == [min(p - s, m) for s in range(p)]


def test_action_roundtrip():
    assert Action.parse("12B7") == Action(12, "B", 7)
    assert str(Action.parse("0F3")) == "0F3"
    with pytest.raises(ConfigError):
        Action.parse("zz")
