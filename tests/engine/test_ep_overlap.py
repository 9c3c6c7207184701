"""``--ep-overlap``: Megatron-Core's combined 1F1B, the all-to-alls of one micro-batch beside
another's compute (perfsim.engine.ep_overlap)."""

from collections import namedtuple
from pathlib import Path

import pytest

from perfsim import predict
from perfsim.engine.ep_overlap import COMM_SM_SHARE, MoELayerTimes, beside, pair_saving, savings
from perfsim.errors import ConfigError
from perfsim.schedules import BACKWARD, FORWARD

MIXTRAL = str(Path(__file__).resolve().parents[1] / "data" / "configs" / "mixtral-8x7b.json")
JOB = dict(model=MIXTRAL, gpu="h100", tp=1, pp=1, dp=8, ep=8, precision="bf16", gpus_per_node=8,
           nic="8x400Gbps:infiniband", micro_batch=1, global_batch=64, recompute="selective", allow_oom=True)


def test_a_phase_is_its_longer_stream_with_the_compute_slowed_by_the_comm_sms():
    assert beside(1.0, 5.0) == 5.0  # communication-bound: the compute hides under it
    assert beside(10.0, 2.0) == pytest.approx(10.0 + COMM_SM_SHARE * 2.0)  # compute-bound, slowed
    assert COMM_SM_SHARE == pytest.approx(20 / 132)


def test_a_pair_saves_its_phases_against_running_one_after_the_other():
    f = MoELayerTimes(attn_fwd=3.0, attn_bwd=6.0, mlp_fwd=2.0, mlp_bwd=4.0, a2a_fwd=1.0, a2a_bwd=1.0, blocks=4)
    b = MoELayerTimes(attn_fwd=3.0, attn_bwd=6.0, mlp_fwd=2.0, mlp_bwd=4.0, a2a_fwd=1.0, a2a_bwd=1.0, blocks=2)
    serial = (3 + 2 + 2) + (6 + 4 + 2)
    phases = beside(3, 1) + beside(4 + 2, 2) + beside(6, 1)
    assert pair_saving(f, b) == pytest.approx(2 * (serial - phases))  # the two stages' fewer MoE blocks
    # communication-bound layers hide at most their all-to-alls
    slow = MoELayerTimes(0.1, 0.2, 0.1, 0.2, 5.0, 5.0, 1)
    assert 0 < pair_saving(slow, slow) <= 4 * 5.0


Action = namedtuple("Action", "kind stage microbatch")


class _Table:
    def __init__(self, rows):
        self.rows, self.num_devices = rows, len(rows)

    def __getitem__(self, d):
        return self.rows[d]


def test_consecutive_forward_and_backward_of_different_micro_batches_pair_up():
    """One stage (pp 1): F0 B0 F1 B1 F2 B2 -- B0 pairs with F1 and B1 with F2, as Megatron-Core's
    combined 1F1B runs F(n) with B(n-1); F0 and B2 stay alone, and F0 with B0 (one micro-batch)
    cannot pair."""
    row = [Action(k, 0, mb) for mb in range(3) for k in (FORWARD, BACKWARD)]
    layer = MoELayerTimes(1.0, 2.0, 1.0, 2.0, 0.5, 0.5, 3)
    out = savings(_Table([row]), [layer])
    assert set(out) == {(0, 0, BACKWARD), (0, 1, FORWARD), (0, 1, BACKWARD), (0, 2, FORWARD)}
    # shared in proportion to each action's own all-to-alls (equal here), never above them
    assert out[(0, 0, BACKWARD)] == pytest.approx(out[(0, 1, FORWARD)])
    assert out[(0, 0, BACKWARD)] + out[(0, 1, FORWARD)] == pytest.approx(pair_saving(layer, layer))
    assert all(v <= 2 * 3 * 0.5 for v in out.values())
    assert savings(_Table([row]), [None]) == {}  # no MoE block: nothing to hide


def test_mixtral_hides_its_all_to_alls_and_keeps_its_compute():
    plain = predict(**JOB).summary
    over = predict(**JOB, ep_overlap=True).summary
    assert over["compute_s"] == pytest.approx(plain["compute_s"])
    assert 0 < over["ep_hidden_s"] < over["ep_comm_s"] == pytest.approx(plain["ep_comm_s"])
    # one stage: the iteration is its one chain of actions, shorter by what they hide
    assert plain["iteration_s"] - over["iteration_s"] == pytest.approx(over["ep_hidden_s"], rel=0.02)
    # compute-bound here: 7 of the 8 micro-batches pair up, each hides 1 - COMM_SM_SHARE of its all-to-alls
    assert over["ep_hidden_s"] == pytest.approx(plain["ep_comm_s"] * 7 / 8 * (1 - COMM_SM_SHARE), rel=0.01)
    assert plain["ep_hidden_s"] == 0 and not plain["ep_overlap"]


@pytest.mark.parametrize("pipeline", [dict(), dict(pp=2, dp=4, ep=4, schedule="interleaved-1f1b", virtual_stages=2),
                                      dict(a2a_compress="fp8")])
def test_the_closed_form_replay_and_the_event_loop_agree(pipeline):
    """Both engines shorten the same actions (every replica simulated, so that the replay applies)."""
    from perfsim.api import build_configs
    from perfsim.engine import simulate

    job = {k: v for k, v in {**JOB, **pipeline}.items() if k != "allow_oom"}
    wl, st, sy, prof = build_configs(**job, ep_overlap=True)
    fast = simulate(wl, st, sy, prof, allow_oom=True, symmetric=False).summary
    slow = simulate(wl, st, sy, prof, allow_oom=True, symmetric=False, replay=False).summary
    assert (fast["engine"], slow["engine"]) == ("replay", "event loop")
    assert fast["iteration_s"] == pytest.approx(slow["iteration_s"], rel=1e-9)
    assert fast["iteration_s"] < simulate(*build_configs(**job), allow_oom=True).summary["iteration_s"]


@pytest.mark.parametrize("changes,needle", [
    (dict(ep=1), "ep_overlap: needs ep > 1"),
    (dict(recompute="full"), "ep_overlap with recompute=full"),
    (dict(pp=2, dp=4, ep=4, schedule="1f1b"), "ep_overlap with pp=2: .* interleaved schedule"),
])
def test_what_it_does_not_model_is_refused_in_one_line(changes, needle):
    with pytest.raises(ConfigError, match=needle):
        predict(**{**JOB, **changes, "ep_overlap": True})


def test_a_compressed_dispatch_hides_its_shorter_all_to_alls_and_keeps_its_codec():
    """--a2a-compress: the phases pair the compressed all-to-alls (the forward dispatch, the gradient into
    the expert outputs) with the full ones; the codec's kernels, on the compute stream, stay serial."""
    f = MoELayerTimes(3.0, 6.0, 2.0, 4.0, a2a_fwd=1.0, a2a_bwd=1.0, blocks=1, wire_fwd=0.5, wire_bwd=0.5)
    assert (f.dispatch_fwd, f.combine_bwd, f.comm_fwd, f.comm_bwd) == (0.5, 0.5, 1.5, 1.5)
    serial = (3 + 2 + 1.5) + (6 + 4 + 1.5)
    phases = beside(3, 0.5) + beside(4 + 2, 0.5 + 1.0) + beside(6, 1.0)  # attn | combine grad, MLPs | dispatches, attn | combine
    assert pair_saving(f, f) == pytest.approx(serial - phases)
    for codec in ("fp8", "directq:4"):
        job = dict(JOB, a2a_compress=codec)
        plain, over = predict(**job).summary, predict(**job, ep_overlap=True).summary
        full = predict(**JOB, ep_overlap=True).summary
        assert over["compute_s"] == pytest.approx(plain["compute_s"])
        assert plain["iteration_s"] - over["iteration_s"] == pytest.approx(over["ep_hidden_s"], rel=0.02)
        # less to hide than uncompressed, and never the codec: hidden < the all-to-alls alone
        assert 0 < over["ep_hidden_s"] < full["ep_hidden_s"] and over["ep_hidden_s"] < over["ep_comm_s"]


def test_an_interleaved_pipeline_pairs_its_steady_state():
    job = dict(JOB, pp=2, dp=4, ep=4, schedule="interleaved-1f1b", virtual_stages=2)
    plain, over = predict(**job).summary, predict(**job, ep_overlap=True).summary
    assert over["iteration_s"] < plain["iteration_s"] and 0 < over["ep_hidden_s"] < over["ep_comm_s"]


def test_the_planners_bound_stays_under_the_simulation():
    """The bounds charge each action its compute and its collectives less every all-to-all the overlap
    may hide (StagePlan.fwd_tp_min / bwd_tp_min): still lower bounds of the shorter iteration."""
    from perfsim.plan_search import forget_jobs, plan_bound

    forget_jobs()
    for job in (JOB, dict(JOB, pp=2, dp=4, ep=4, schedule="interleaved-1f1b", virtual_stages=2)):
        p = dict(job, ep_overlap=True)
        assert 0 < plan_bound(p) <= predict(**p).summary["iteration_s"]


def test_megatron_flags_say_the_overlap():
    from perfsim.api import build_configs
    from perfsim.emit import moe_args_of

    wl, st, _, _ = build_configs(**{k: v for k, v in JOB.items() if k != "allow_oom"}, ep_overlap=True)
    assert "--overlap-moe-expert-parallel-comm" in moe_args_of(wl.arch, st)[0]
    assert "--overlap-moe-expert-parallel-comm" not in moe_args_of(wl.arch, build_configs(
        **{k: v for k, v in JOB.items() if k != "allow_oom"})[1])[0]
