"""Context parallelism (``--cp``; Megatron-Core's ring of key/value exchanges, perfsim.engine.context_parallel):
what a rank computes, what its ring costs and hides, where its gradients go, its memory, its
figures and refusals. Checked against the geometry of the load-balanced causal split; no
context-parallel step was timed."""

import dataclasses

import pytest

import perfsim
from perfsim.api import build_configs
from perfsim.engine import plan_with_memory
from perfsim.engine.context_parallel import cp_stage_times
from perfsim.errors import ConfigError
from perfsim.models.ops import block_ops
from perfsim.models.registry import get_spec

JOB = dict(model="llama3-8b", gpu="h100", gpus_per_node=8, nic="8x400Gbps:infiniband", tp=8, pp=1, dp=1,
           micro_batch=1, global_batch=8, precision="bf16", attention="flash", recompute="selective",
           sequence_parallel=True, seq_len=32768, allow_oom=True)


def test_a_rank_computes_its_tokens_and_a_cp_th_of_the_pairs():
    spec = dataclasses.replace(get_spec("llama3-8b"), seq_len=32768)
    for cp in (2, 4, 8):
        shard = spec.context_shard(cp)
        assert (shard.seq_len, shard.context_shards) == (32768 // cp, cp)
        full_ops = {o.name: o for o in block_ops(spec, 1, 1, False, 2, "flash")}
        ops = {o.name: o for o in block_ops(shard, 1, 1, False, 2, "flash")}
        # its queries against every key, causal and load-balanced: 1/cp of the sequence's pairs
        assert ops["flash_attention"].attended_pairs * cp == full_ops["flash_attention"].attended_pairs
        assert (ops["flash_attention"].m, ops["flash_attention"].n) == (32768 // cp, 32768)
        assert ops["qkv"].m * cp == full_ops["qkv"].m and ops["mlp_up"].m * cp == full_ops["mlp_up"].m
        # the model FLOPs of a rank's shard are 1/cp of a sequence's
        assert sum(layer.flops_fwd for layer in shard.layers()) * cp == pytest.approx(
            sum(layer.flops_fwd for layer in spec.layers()))


def test_the_ring_hides_behind_long_attention_and_not_behind_a_slow_link():
    w, st, sy, pr = build_configs(**dict(JOB, cp=2))
    net = plan_with_memory(w, st, sy, pr, allow_oom=True)[0]
    gpu = perfsim.hardware.get_gpu("h100")
    fwd, bwd, sent = cp_stage_times(w.context_rank(2), st, net, 0, 32, gpu)
    assert fwd == bwd == 0.0 and sent > 0  # NVLink inside the node: every exchange hidden
    # one GPU a node over 1 Gbit/s: the ring is the exposed part of the layer collectives
    slow = dict(JOB, cp=2, tp=1, gpus_per_node=1, nic="1x1Gbps", sequence_parallel=False)
    w, st, sy, pr = build_configs(**slow)
    net, plan, _ = plan_with_memory(w, st, sy, pr, allow_oom=True)
    fwd, bwd, sent = cp_stage_times(w.context_rank(2), st, net, 0, 32, gpu)
    kv = 16384 * 8 * 128 * 2 * 2  # a shard's keys and values: 8 heads of 128, bf16
    assert sent == pytest.approx(32 * (kv + 2 * kv))  # one shard forward; keys, values and gradients back
    assert 0 < fwd < bwd and plan.stages[0].fwd_tp_s == pytest.approx(fwd)


def test_gradients_are_reduced_over_dp_x_cp_and_the_figures_are_the_jobs():
    one = perfsim.predict(**JOB).summary
    two = perfsim.predict(**dict(JOB, cp=2)).summary
    assert one["dp_bytes"] == 0 and two["dp_bytes"] > 0  # the two ranks of a context-parallel group sync
    assert (two["dp"], two["cp"]) == (1, 2)
    for s in (one, two):  # every sample's whole sequence, once
        assert s["throughput_tokens_per_s"] == pytest.approx(8 * 32768 / s["iteration_s"])
    assert two["iteration_s"] < one["iteration_s"] and two["peak_memory_gib"] < one["peak_memory_gib"]
    dp2 = perfsim.predict(**dict(JOB, dp=2)).summary  # the same GPUs as replicas: no ring, longer rows
    assert dp2["peak_memory_gib"] > two["peak_memory_gib"]
    assert "context parallel 2: each rank computes 16384 of every 32768 tokens" in two["model_note"]


def test_megatron_flags():
    from perfsim.emit import megatron_args

    args, _ = megatron_args(dict(JOB, cp=4), 8)
    assert args[args.index("--context-parallel-size") + 1] == "4" and args[args.index("--cp-comm-type") + 1] == "p2p"
    assert args[args.index("--seq-length") + 1] == "32768"  # the sequence, not a rank's shard


@pytest.mark.parametrize("change, needle", [
    (dict(gpu=None, profile="cpu-2core", model="gpt2-tiny", attention=None, precision="fp32", tp=1,
          sequence_parallel=False, seq_len=None, gpus_per_node=None, nic=None), "cp=2: context parallelism is priced from a GPU"),
    (dict(attention="megatron"), "use --attention flash"),
    (dict(seq_len=32766), "2 x cp = 4 equal chunks"),
    (dict(model="gemma-2-9b"), "sliding window"),
    (dict(cp=0), "cp=0"),
])
def test_refusals(change, needle):
    kw = {k: v for k, v in {**JOB, "cp": 2, **change}.items() if v is not None}
    with pytest.raises(ConfigError, match=needle):
        perfsim.predict(**kw)


def test_perfsim_memory_offers_context_parallelism_where_it_is_modelled():
    from perfsim.analysis.memory_fit import memory_report

    job = {k: v for k, v in dict(JOB, seq_len=131072, dp=2).items() if k != "allow_oom"}
    report = memory_report(**job)
    assert not report.fits
    options = {flags: fits for flags, _, fits in report.options}
    assert options["--cp 2 --dp 1"] and not options["--pp 2 --dp 1"]  # 57.1 GiB fits, 81.4 GiB does not
    cpu = memory_report(model="gpt2-tiny", pp=2, dp=2, global_batch=8)  # no GPU preset: not offered
    assert not any(flags.startswith("--cp") for flags, _, _ in cpu.options)


def test_the_three_exchanges():
    """--cp-comm: the ring hides, the all-gather (Llama 3's) and Ulysses' all-to-alls do not; each
    sends its own bytes."""
    from perfsim.engine.context_parallel import cp_collectives

    job = dict(JOB, cp=2, tp=4)
    times = {c: perfsim.predict(cp_comm=c, **job).summary for c in ("p2p", "allgather", "a2a")}
    assert times["p2p"]["tp_comm_s"] < times["allgather"]["tp_comm_s"]
    assert times["p2p"]["tp_comm_s"] < times["a2a"]["tp_comm_s"]
    w, st, _, _ = build_configs(**dict(job, cp_comm="a2a"))
    shard = w.context_rank(2).arch
    tok = 16384  # a rank's tokens
    q, kv, out = tok * 4096 // 4 * 2, tok * 2 * 1024 // 4 * 2, tok * 4096 // 4 * 2
    assert cp_collectives(shard, st) == [("fwd", "alltoall", q + kv, False), ("fwd", "alltoall", out, False),
                                         ("bwd", "alltoall", q + kv, False), ("bwd", "alltoall", out, False)]
    with pytest.raises(ConfigError, match="1 key/value heads must split 2 ways"):  # tp 8: one head a rank
        perfsim.predict(**dict(JOB, cp=2, cp_comm="a2a"))
    from perfsim.emit import megatron_args

    args = megatron_args(dict(job, cp_comm="allgather"), 8)[0]
    assert args[args.index("--cp-comm-type") + 1] == "allgather"
    assert "cp_comm a2a unused: cp 1" in perfsim.predict(**dict(JOB, cp_comm="a2a")).summary["model_note"]


def test_plan_searches_context_parallelism_for_long_sequences():
    """From 16,384 tokens (perfsim.plan.LONG_SEQUENCE) a GPU job's plan searches cp 1, 2, 4, 8 unless --cp
    says otherwise, and says so; shorter sequences keep cp 1."""
    from perfsim.plan import candidates

    kw = dict(model="llama3-8b", gpu="h100", nodes=2, gpus_per_node=8, tp=8, global_batch=8, precision="bf16",
              attention="flash", recompute="none", zero=0, compress="fp32", grad_compress="none")

    def searched(**more):
        cands, notes = candidates(**kw, **more)
        return {c.params.get("cp", 1) for c in cands}, notes

    cps, notes = searched(seq_len=32768)
    assert cps == {1, 2} and any("context parallelism searched over cp 1, 2" in n for n in notes)  # tp 8 of 16
    cps, notes = searched(seq_len=32768, cp=[1])
    assert cps == {1} and not any("context parallelism" in n for n in notes)
    assert searched(seq_len=8192)[0] == {1}
    assert perfsim.plan(seq_len=32768, **kw).ranked  # the search runs with them


def test_emit_perfsim_states_cp_and_says_run_cannot_train_it():
    from perfsim.emit import emit

    p = dict(model="gpt2-tiny", gpu="h100", gpus_per_node=8, tp=1, cp=2, pp=1, dp=1, micro_batch=1, macro_batch=8,
             precision="bf16", attention="flash", compress="fp32", grad_compress="none")
    first, command = emit(p, "perfsim", nodes=1, global_batch=8).splitlines()
    assert first.startswith("# perfsim run cannot train cp;") and "--cp 2" in command
    assert "--cp" not in emit(dict(p, cp=1), "perfsim", nodes=1, global_batch=8)


def test_pipeline_messages_are_the_shards():
    """A rank sends its own tokens' activations across a pipeline boundary: half of them with cp 2, over
    twice the ranks -- the same bytes in all."""
    one = perfsim.predict(**dict(JOB, pp=2, tp=4)).summary
    two = perfsim.predict(**dict(JOB, pp=2, tp=4, cp=2)).summary
    assert one["pipeline_bytes"] > 0 and two["pipeline_bytes"] == pytest.approx(one["pipeline_bytes"])
