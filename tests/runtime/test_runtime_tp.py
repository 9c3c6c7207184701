"""Real tensor parallelism in execute mode: 2 gloo ranks per TP group (gpt2-tiny)."""

import json
from pathlib import Path

import pytest
import torch

from perfsim.errors import ConfigError
from perfsim.runtime import run
from perfsim.runtime.tensor_parallel import RankLayout, megatron_qkv_order

from _helpers import PINNED_FLAGS, assert_user_error, gloo_group, run_cli, spawn_ranks

TINY = dict(model="gpt2-tiny", micro_batch=2, macro_batch=4, steps=3, timeout="60s", schedule="1f1b")
SPEC = dict(hidden=128, seq=64)  # gpt2-tiny


def megatron_layer_collectives(hidden, seq, micro_batch, tp, sequence_parallel, bytes_per_value):
    """Megatron-LM's closed form for one transformer layer (Shoeybi et al., arXiv:1909.08053,
    Sec. 3: two allreduces of the b x s x h activation forward, two backward; Korthikanti et al.,
    arXiv:2205.05198, Sec. 4.2.2: with sequence parallelism each becomes an all-gather plus a
    reduce-scatter of the same tensor). Bytes: what each rank hands to the collective
    (the full tensor; its 1/tp shard for an all-gather)."""
    n = float(hidden * seq * micro_batch * bytes_per_value)
    if not sequence_parallel:
        return (("fwd", "allreduce", n),) * 2 + (("bwd", "allreduce", n),) * 2
    return (("fwd", "allgather", n / tp), ("fwd", "reduce_scatter", n)) * 2 + \
        (("bwd", "allgather", n / tp), ("bwd", "reduce_scatter", n)) * 2


def simulator_layer_collectives(**kw):
    """The simulator's per-layer TP collectives (perfsim.models.tensor_parallel), else
    Megatron's closed form above."""
    try:
        from perfsim.models.tensor_parallel import tp_layer_collectives
    except ImportError:
        return megatron_layer_collectives(**kw)
    return tp_layer_collectives(**kw)


# ----------------------------------------------------------------------------- one layer
def _layer_worker(rank, port, out_path):
    """One block, sharded both ways (plain TP, then TP + sequence parallelism) in one
    process group: what each rank's collectives were and how far its output is from
    the unsharded block's."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode

    from perfsim.models.registry import get_model_spec
    from perfsim.runtime.models import Stage
    from perfsim.runtime.tensor_parallel import CollectiveMeter, parallelize_stage

    with gloo_group(rank, 2, port):
        spec = get_model_spec("gpt2-tiny")
        mb = 2
        mesh = init_device_mesh("cpu", (2,))
        seen = {}
        for sequence_parallel in (False, True):
            full = Stage(spec, 1, 2, seed=3)  # one transformer block
            tp_block = Stage(spec, 1, 2, seed=3)
            parallelize_stage(tp_block, mesh, sequence_parallel)
            x = torch.randn(mb, spec.seq_len, spec.hidden, generator=torch.Generator().manual_seed(7))
            ref = full(x)
            xin = x.chunk(2, dim=1)[rank] if sequence_parallel else x
            xin = xin.clone().requires_grad_(True)
            comm = CommDebugMode()
            meter = CollectiveMeter(mesh.get_group().group_name)
            with comm, meter:
                y = tp_block(xin)
                fwd = meter.pop()
                y.sum().backward()
                bwd = meter.pop()
            want = ref.chunk(2, dim=1)[rank] if sequence_parallel else ref
            counts = {str(k): v for k, v in comm.get_comm_counts().items()}
            seen[str(sequence_parallel)] = {"fwd": [e[:2] for e in fwd], "bwd": [e[:2] for e in bwd],
                                            "counts": counts, "max_err": float((y - want).abs().max())}
        with open(f"{out_path}.{rank}", "w") as f:
            json.dump(seen, f)


@pytest.fixture(scope="module")
def layer_collectives(tmp_path_factory):
    """Each rank's record of :func:`_layer_worker` (both shardings: one spawn of 2 ranks)."""
    out = tmp_path_factory.mktemp("layer") / "layer"
    spawn_ranks(_layer_worker, str(out))
    return [json.loads(Path(f"{out}.{rank}").read_text()) for rank in (0, 1)]


@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["tp", "tp+sp"])
def test_layer_collectives_equal_the_simulators(layer_collectives, sequence_parallel):
    """What torch's TP really sends for one block (kind and bytes, forward and backward)
    is what the simulator charges per layer; CommDebugMode sees no other collective,
    and the sharded block computes the unsharded block's output."""
    want = simulator_layer_collectives(micro_batch=2, tp=2, sequence_parallel=sequence_parallel,
                                       bytes_per_value=4, **SPEC)
    for rank in (0, 1):
        got = layer_collectives[rank][str(sequence_parallel)]
        assert got["max_err"] < 1e-5
        for phase in ("fwd", "bwd"):
            expect = sorted((k, float(b)) for p, k, b in want if p == phase)
            assert sorted((k, float(b)) for k, b in got[phase]) == expect
        # the meter saw every collective torch's own comm counter saw
        kinds = {"allreduce": "all_reduce", "allgather": "all_gather_into_tensor",
                 "reduce_scatter": "reduce_scatter_tensor"}
        seen = {}
        for _, k, _ in want:
            seen[kinds[k]] = seen.get(kinds[k], 0) + 1
        assert {k.split(".")[-1]: v for k, v in got["counts"].items()} == seen


def test_qkv_order_gives_each_rank_its_heads():
    d, tp = 8, 2
    order = megatron_qkv_order(d, tp).tolist()
    # rank 0: q, k, v rows of heads 0..(H/2 - 1) = rows 0-3 of each of q, k, v
    assert order[:12] == [0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19]
    assert sorted(order) == list(range(3 * d))


def test_rank_layout_follows_the_placement():
    lay = RankLayout(tp=2, dp=2, pp=2, placement=("tp", "dp", "pp"))  # Megatron's
    assert [lay.coords(r) for r in range(4)] == [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)]
    assert lay.rank(1, 0, 1) == 5 and lay.dp_group_ranks()[0] == [0, 2]
    assert all(lay.rank(*lay.coords(r)) == r for r in range(8))
    lay = RankLayout(tp=2, dp=2, pp=2)  # perfsim's default, tp, pp, dp: a replica's stages adjacent
    assert [lay.coords(r) for r in range(4)] == [(0, 0, 0), (0, 0, 1), (1, 0, 0), (1, 0, 1)]
    assert lay.rank(0, 1, 0) == 4 and lay.dp_group_ranks()[0] == [0, 4]
    assert all(lay.rank(*lay.coords(r)) == r for r in range(8))


# ----------------------------------------------------------------------------- whole runs
@pytest.fixture(scope="module")
def tp1_losses(tmp_path_factory):
    return run(pp=1, tp=1, out=tmp_path_factory.mktemp("tp1"), **TINY).losses


@pytest.fixture(scope="module")
def tp2_runs(tmp_path_factory):
    """``tp2_runs(sp) -> (Result, out folder)``: pp=1 x tp=2 with or without sequence
    parallelism, each run once for the tests that read it (checkpoints at steps 2 and 3:
    the resume test starts from step 2). Module-scoped, not the conftest's
    ``shared_run``: no other file runs these jobs, and ``shared_run`` would tie this
    file's runs to every other file's on one xdist worker."""
    done = {}

    def get(sp: bool):
        if sp not in done:
            out = tmp_path_factory.mktemp("tp2")
            done[sp] = run(pp=1, tp=2, sequence_parallel=sp, checkpoint_every=2, out=out, **TINY), out
        return done[sp]

    return get


@pytest.mark.parametrize("sp", [False, True], ids=["tp2", "tp2+sp"])
def test_tp2_trains_like_tp1_and_is_measured(tp1_losses, tp2_runs, sp):
    r, _ = tp2_runs(sp)
    assert list(r.losses) == list(tp1_losses) == [0, 1, 2]
    for s in tp1_losses:
        assert r.losses[s] == pytest.approx(tp1_losses[s], rel=1e-5)
    s = r.summary
    assert s["tp"] == 2 and s["sequence_parallel"] == sp and s["source"] == "measured"
    # bytes: every rank, 4 blocks, 2 micro-batches per step, the simulator's per-layer buffers
    per_layer = sum(b for _, _, b in simulator_layer_collectives(
        micro_batch=2, tp=2, sequence_parallel=sp, bytes_per_value=4, **SPEC))
    if not sp:
        assert s["tp_bytes"] == 2 * 4 * 2 * per_layer
    else:  # + per micro-batch the embedding's scatter (backward: all-gather of a half) and the
        # head's all-gather, + per step the allreduce of the 4 LayerNorm gradients (128 floats) of a block
        act = 2 * 64 * 128 * 4
        assert s["tp_bytes"] == 2 * (4 * 2 * per_layer + 2 * 2 * act // 2 + 4 * 4 * 128 * 4)
    assert [(row["stage"], row["tp_rank"]) for row in r.stages] == [(0, 0), (0, 1)]
    assert all(row["tp_comm_s"] > 0 and row["compute_s"] > 0 for row in r.stages)
    kinds = {e["name"] for e in r.trace_events if e.get("cat") == "tp"}
    assert ({"tp allgather", "tp reduce_scatter"} if sp else {"tp allreduce"}) <= kinds


def test_tp_composes_with_pp_and_dp(tp1_losses, tmp_path):
    """pp=2 x tp=2 (4 ranks) trains the same model; ranks are ordered TP, then DP, then PP."""
    r = run(pp=2, tp=2, out=tmp_path / "pp2", **TINY)
    for s in tp1_losses:
        assert r.losses[s] == pytest.approx(tp1_losses[s], rel=1e-5)
    assert r.summary["pipeline_bytes"] == 2 * 2 * 2 * (2 * 64 * 128 * 4)  # 2 tp ranks, 2 mb, fwd+bwd
    assert sorted((row["stage"], row["tp_rank"]) for row in r.stages) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    names = {e["args"]["name"] for e in r.trace_events if e.get("name") == "thread_name"}
    assert names == {"stage 0 tp 0 (rank 0)", "stage 0 tp 1 (rank 1)", "stage 1 tp 0 (rank 2)",
                     "stage 1 tp 1 (rank 3)"}


@pytest.mark.parametrize("schedule,boundaries,layers", [
    ("interleaved-1f1b", 3, ["0-1,3-3", "2-2,4-5"]),  # 4 chunks, every boundary crosses devices
    ("zb-h1", 1, ["0-2", "3-5"]),  # I/W split backward on sharded blocks
    ("zb-v", 2, ["0-1,4-5", "2-2,3-3"]),  # V shape: the middle boundary stays on device 1
])
def test_tp_composes_with_multi_chunk_schedules(tp1_losses, tmp_path, schedule, boundaries, layers):
    """pp=2 x tp=2 under the schedules with several chunks per rank or split backwards:
    each chunk is sharded, every TP rank talks to its peer of the next chunk's device."""
    r = run(pp=2, tp=2, out=tmp_path / schedule, **dict(TINY, schedule=schedule))
    for s in tp1_losses:
        assert r.losses[s] == pytest.approx(tp1_losses[s], rel=1e-5)
    act = 2 * 64 * 128 * 4
    assert r.summary["pipeline_bytes"] == 2 * 2 * 2 * boundaries * act  # 2 tp ranks, 2 mb, fwd+bwd
    assert r.summary["tp_bytes"] == 2 * 4 * 2 * 4 * act  # ranks, blocks, mb, allreduces: as pp=1
    assert sorted((row["stage"], row["tp_rank"], row["layers"]) for row in r.stages) == \
        [(d, t, layers[d]) for d in range(2) for t in range(2)]


def test_tp_with_dp_equals_dp_alone(tmp_path):
    kw = dict(TINY, pp=1, dp=2)
    ref = run(tp=1, out=tmp_path / "dp", **kw)
    r = run(tp=2, out=tmp_path / "dptp", **kw)
    for s in ref.losses:
        assert r.losses[s] == pytest.approx(ref.losses[s], rel=1e-5)
    # each of the 4 ranks averages its own local shard (fp32 gradients, no compression)
    assert [row["params"] for row in r.stages][0] < [row["params"] for row in ref.stages][0]
    assert r.summary["dp_bytes"] == 4 * sum(row["params"] for row in r.stages)
    assert ref.summary["dp_bytes"] == 4 * sum(row["params"] for row in ref.stages)


@pytest.mark.parametrize("kw, culprit", [
    (dict(model="digits-mlp", pp=2, micro_batch=8, schedule="1f1b", tp=2), "GPT"),
    (dict(model="gpt2-tiny", pp=2, micro_batch=8, schedule="1f1b", tp=3), "tp=3"),
    (dict(model="gpt2-tiny", pp=2, micro_batch=8, schedule="1f1b", tp=1, sequence_parallel=True),
     "sequence_parallel"),
    # execute mode sends the whole activation from every TP rank (predict's tp_send=full)
    (dict(model="gpt2-tiny", pp=2, micro_batch=8, schedule="1f1b", tp=2, tp_send="scatter-gather"),
     "tp_send='scatter-gather'"),
])
def test_bad_tp_is_a_config_error(kw, culprit):
    from perfsim.runtime import make_config

    with pytest.raises(ConfigError, match=culprit):
        make_config(**kw)


def test_cli_tp_bad_input_one_line(tmp_path):
    proc = run_cli("run", *PINNED_FLAGS, "--tp", "2", "--out", str(tmp_path / "x"))
    assert_user_error(proc.returncode, proc.stderr, "tp=2")


def test_tp_resume_continues_the_same_training(tp1_losses, tp2_runs, tmp_path):
    """Checkpoints of sharded stages (DTensor weights, local optimizer state) resume."""
    _, part = tp2_runs(False)
    r = run(pp=1, tp=2, resume=part / "ckpt" / "step00000002", out=tmp_path / "rest", **TINY)
    assert r.summary["start_step"] == 2 and list(r.losses) == [0, 1, 2]
    for s in tp1_losses:
        assert r.losses[s] == pytest.approx(tp1_losses[s], rel=1e-5)


def test_collectives_are_taken_out_of_the_compute_they_interrupt():
    """charge_step matches the runtime's compute events (``<stage>F<mb>``, ``B``, ``I``,
    ``W``): a collective inside one leaves that micro-batch's compute, one outside
    none; every collective counts as TP communication."""
    from perfsim.runtime.pipeline import MicroRecord, StepRecord
    from perfsim.runtime.tensor_parallel import charge_step

    rec = StepRecord(0, 0, 0.0, 1.0, None, [MicroRecord(0.5, 0.7), MicroRecord(0.4, 0.6)])
    rec.events = [("0F0", "compute", 0.0, 0.5, None), ("1B1", "compute", 0.5, 1.1, None),
                  ("0W0", "compute", 1.1, 1.3, None)]
    charge_step(rec, [("allreduce", 64, 0.1, 0.2), ("allreduce", 64, 0.6, 0.9),
                      ("allreduce", 64, 1.15, 1.2), ("allreduce", 64, 2.0, 2.5)])
    assert rec.micro[0].fwd_compute_s == pytest.approx(0.4)
    assert rec.micro[1].bwd_compute_s == pytest.approx(0.3)
    assert rec.micro[0].bwd_compute_s == pytest.approx(0.65)
    assert rec.micro[1].fwd_compute_s == pytest.approx(0.4)
    assert rec.tp_comm_s == pytest.approx(0.1 + 0.3 + 0.05 + 0.5) and rec.tp_bytes == 256
