"""Mixture of experts: FLOPs, operators, capacity factor, memory and predictions."""

from dataclasses import replace
from pathlib import Path

import pytest

from perfsim.errors import ConfigError
from perfsim.hardware import get_gpu
from perfsim.memory import GIB, layer_activation_bytes
from perfsim.models.hf_config import from_hf_config
from perfsim.models.moe import Routing, expert_rows, moe_ops
from perfsim.models.tensor_parallel import shard_block_params, tp_layer_collectives
from perfsim.models.transformer import parse_inline

CONFIGS = Path(__file__).parents[1] / "data" / "configs"
MIXTRAL = str(CONFIGS / "mixtral-8x7b.json")
H100 = "h100-sxm5-80gb"


def test_block_flops_count_the_active_experts_and_the_router():
    s = from_hf_config(MIXTRAL, seq_len=1024)
    T = 1024
    layers = s.layers()
    norms = s.norms_per_block * s.norm_params()
    # the GEMM weights a token meets = its active parameters less the norms (no biases)
    assert s.gemm_weights(0) == s.active_block_params(0) - norms
    assert layers[1].flops_fwd == T * (2 * s.gemm_weights(0) + 4 * T * s.q_dim)
    # a dense model of the same attention and an MLP as wide as two experts costs the
    # same but for the router's 2 x hidden x experts per token
    dense = replace(s, experts=0, top_k=0, expert_ffn=0, ffn=2 * 14336)
    assert layers[1].flops_fwd - dense.layers()[1].flops_fwd == T * 2 * 4096 * 8


def test_moe_ops_flops_and_capacity_factor():
    s = from_hf_config(MIXTRAL, seq_len=1024)
    tok = 1024
    ops = moe_ops(s, tok, 1, 2)
    gemm = {op.name: op for op in ops if op.m}
    assert gemm["router"].flops == 2 * tok * 4096 * 8
    expert = gemm["expert_up"].flops + gemm["expert_down"].flops
    assert expert == 2 * tok * 2 * 3 * 4096 * 14336  # top-2, three matrices, dropless
    padded = {op.name: op for op in moe_ops(s, tok, 1, 2, Routing(capacity_factor=1.25)) if op.m}
    assert padded["expert_up"].flops / gemm["expert_up"].flops == pytest.approx(1.25)
    assert expert_rows(s, tok) == 256 and expert_rows(s, tok, Routing(1.25)) == 320
    # tensor parallelism splits every expert's FFN
    tp8 = {op.name: op for op in moe_ops(s, tok, 8, 2) if op.m}
    assert tp8["expert_up"].flops * 8 == gemm["expert_up"].flops


def test_moe_block_time_prices_experts_router_and_permutation():
    from perfsim import hardware
    from perfsim.engine import compute

    s = from_hf_config(MIXTRAL, seq_len=4096)
    gpu = get_gpu(H100)
    curve = hardware.curve_for(gpu)[0]
    moe_f, moe_b = compute.transformer_times(s, gpu, "bf16", 1, 8, False, "none", curve)
    dense = replace(s, experts=0, top_k=0, expert_ffn=0, ffn=2 * 14336)
    den_f, _ = compute.transformer_times(dense, gpu, "bf16", 1, 8, False, "none", curve)
    assert den_f[1] < moe_f[1] < 1.5 * den_f[1]  # same FLOPs + routing, permutation, smaller GEMMs
    cf_f, _ = compute.transformer_times(s, gpu, "bf16", 1, 8, False, "none", curve, routing=Routing(2.0))
    assert cf_f[1] > moe_f[1]
    # DeepSeekMoE: the first block keeps its dense MLP and is priced as one
    ds = from_hf_config(CONFIGS / "deepseek-moe-16b.json")
    f, _ = compute.transformer_times(ds, gpu, "bf16", 1, 1, False, "none", curve)
    assert f[1] != f[2] and f[2] == f[3]


def test_tp_shards_every_expert_and_keeps_the_router():
    s = from_hf_config(MIXTRAL)
    per = shard_block_params(s, 8, 0)
    router, norms = 4096 * 8, 2 * 4096
    assert (per - router - norms) * 8 == s.block_params(0) - router - norms


def test_parallel_block_has_one_forward_reduction():
    both = tp_layer_collectives(4544, 2048, 1, 2, False, 2)
    one = tp_layer_collectives(4544, 2048, 1, 2, False, 2, parallel_block=True)
    assert [ph for ph, _, _ in both] == ["fwd", "fwd", "bwd", "bwd"]
    assert [ph for ph, _, _ in one] == ["fwd", "bwd", "bwd"]


def test_expert_activations_in_the_memory_model():
    s = from_hf_config(MIXTRAL, seq_len=1024)
    dense = replace(s, experts=0, top_k=0, expert_ffn=0)
    moe = layer_activation_bytes(s, 1, 1, False, "none", 2)
    one = layer_activation_bytes(dense, 1, 1, False, "none", 2)
    # top-2: two copies of each token's expert activations (3 x 14336 values) and hidden state
    extra = 2 * (1024 * 14336 * 3 + 2 * 1024 * 4096 + 2 * 1024 * 8)
    assert moe - one == pytest.approx(extra)
    assert layer_activation_bytes(s, 1, 1, False, "none", 2, routing=Routing(1.5)) > moe


def test_predict_prices_mixtral_as_a_mixture():
    from perfsim.api import predict

    r = predict(model=MIXTRAL, gpu=H100, tp=8, pp=4, gpus_per_node=8, precision="bf16",
                nic="8x400Gbps:infiniband", micro_batch=1, global_batch=32)
    s = r.summary
    assert s["params"] == 46_702_792_704 and s["active_params"] == 12_879_925_248
    assert "12.88 B active" in s["model_note"] and "dropless" in s["model_note"]
    assert "sequence 4096 tokens" in s["model_note"]
    # every expert's weights are in memory: bf16 weights of a quarter of the blocks, split 8 ways
    stage = r.stages[1]
    spec = from_hf_config(MIXTRAL)
    assert stage["weights_gib"] * GIB == pytest.approx(2 * 8 * shard_block_params(spec, 8, 8), rel=1e-9)
    cf = predict(model=MIXTRAL, gpu=H100, tp=8, pp=4, gpus_per_node=8, precision="bf16",
                 nic="8x400Gbps:infiniband", micro_batch=1, global_batch=32, moe_capacity_factor=1.25)
    assert cf.summary["iteration_s"] > s["iteration_s"]
    assert "capacity factor 1.25" in cf.summary["model_note"]


def test_capacity_factor_needs_experts_and_a_positive_value():
    from perfsim.api import predict

    with pytest.raises(ConfigError, match="has no experts"):
        predict(model="llama2-7b", gpu=H100, pp=1, precision="bf16", moe_capacity_factor=1.25)
    with pytest.raises(ConfigError, match="moe_capacity_factor"):
        predict(model=MIXTRAL, gpu=H100, pp=1, precision="bf16", moe_capacity_factor=0)


def test_inline_moe_spec():
    s = parse_inline("llama:layers=2,hidden=64,heads=8,seq=16,vocab=100,ffn=96,experts=4,top_k=2")
    assert s.moe and s.expert_ffn == 96
    mlp = 3 * 64 * 96
    assert s.params - s.active_params == 2 * 2 * mlp  # 2 blocks x 2 idle experts
    with pytest.raises(ConfigError, match="top_k=5"):
        parse_inline("llama:layers=2,hidden=64,heads=8,seq=16,vocab=100,experts=4,top_k=5")


EP = dict(model=MIXTRAL, gpu=H100, pp=1, dp=8, ep=8, gpus_per_node=8, precision="bf16",
          nic="8x400Gbps:infiniband", micro_batch=1, global_batch=64, recompute="full")


def test_expert_parallel_mixtral_on_16_h100s():
    from perfsim.api import build_configs, predict
    from perfsim.network import collective_cost

    r = predict(**EP, tp=2)
    s = r.summary
    assert (s["gpus"], s["ep"], s["fits"]) == (16, 8, True)
    spec = from_hf_config(MIXTRAL)
    # each GPU holds 1 of the 8 experts of every block (split 2 ways), the rest as TP 2
    wl = build_configs(**EP, tp=2)[0]
    assert wl.params_of(1) == shard_block_params(spec, 2, 0, ep=8)
    expert = 3 * 4096 * 14336
    assert shard_block_params(spec, 2, 0) - shard_block_params(spec, 2, 0, ep=8) == 7 * expert // 2
    assert r.stages[0]["weights_gib"] * GIB == pytest.approx(2 * sum(wl.params_of(i) for i in range(34)))
    # four all-to-alls per MoE block and micro-batch (dispatch, combine; forward and backward)
    # plus the forward's again under full recomputation, of the top-2 copies of 4096 tokens
    size = 4096 * 2 * 4096 * 2
    per_mb = 32 * (4 + 2) * collective_cost("alltoall", size, 8)[0]
    assert s["ep_bytes"] == pytest.approx(per_mb * 8 * 8 * 2)  # micro-batches x dp x tp
    assert s["ep_comm_s"] > 0
    # expert gradients stay on their replica: the dp sync carries the rest only
    dense_sync = predict(**{**EP, "ep": 1}, tp=2, allow_oom=True).summary["dp_bytes"]
    assert s["dp_bytes"] < 0.1 * dense_sync


def test_expert_parallel_mixtral_on_8_h100s_does_not_fit_and_says_so():
    from perfsim.api import predict

    r = predict(**EP, allow_oom=True)
    assert r.summary["gpus"] == 8 and r.summary["fits"] is False  # 46.7 B x 16 bytes > 8 x 80 GB
    assert r.stages[0]["weights_gib"] == pytest.approx(13.5, abs=0.05)
    with pytest.raises(ConfigError, match="short by"):
        predict(**EP)


def test_expert_all_to_all_across_nodes_uses_the_nics_and_imbalance_slows_it():
    from perfsim.api import predict

    inside = predict(**EP, allow_oom=True).summary
    across = predict(**{**EP, "gpus_per_node": 4, "nic": "4x100Gbps:infiniband"}, allow_oom=True).summary
    assert across["ep_comm_s"] > 2 * inside["ep_comm_s"]
    assert across["ep_bytes"] == inside["ep_bytes"]
    skew = predict(**EP, moe_imbalance=1.5, allow_oom=True).summary
    assert skew["iteration_s"] > inside["iteration_s"] and skew["ep_comm_s"] > inside["ep_comm_s"]


@pytest.mark.parametrize("changes,match", [
    (dict(dp=3, ep=3, global_batch=3), "ep=3: does not divide the 8 experts"),
    (dict(ep=3), "ep=3: must divide dp=8"),
    (dict(ep=4, grad_compress="powersgd:4"), "ep=4 < dp=8: .* per-matrix hook; give --ep equal to --dp"),
    (dict(ep=4, grad_compress="onebit-adam"), "ep=4 < dp=8: .* 1-bit optimizer"),
    (dict(model="llama2-7b"), "ep=8: model 'llama2-7b' has no experts"),
    (dict(zero=2), "zero=2 with ep=8: not modelled"),
    (dict(moe_imbalance=0.5), "moe_imbalance=0.5: must be a finite number >= 1"),
    # qa3: 9 x the balanced share was priced (12 s an iteration); one rank of ep 8 holding one of
    # Mixtral's 8 experts receives at most every token once: 8 x 1 / top-2 = 4 x the balanced share
    (dict(moe_imbalance=9), r"moe_imbalance=9: more than the busiest rank can receive \(at most 4"),
])
def test_expert_parallel_errors(changes, match):
    from perfsim.api import predict

    with pytest.raises(ConfigError, match=match):
        predict(**{**EP, **changes})


@pytest.mark.parametrize("changes", [dict(ep=1), dict(moe_capacity_factor=1.25)])
def test_an_imbalance_that_changes_nothing_is_said_unused_not_refused(changes):
    """qa8: ``--ep 1,2,4 --moe-imbalance 1.5`` was refused whole for its ep-1 point (a2a_compress
    with ep 1 is accepted as unused): on one rank, or padded to capacity, the experts' work does
    not depend on the routing, so the prediction is the balanced one and a note says so."""
    from perfsim.api import predict

    plain = predict(**{**EP, **changes}, allow_oom=True).summary
    skew = predict(**{**EP, **changes}, moe_imbalance=1.5, allow_oom=True).summary
    assert skew["iteration_s"] == plain["iteration_s"]
    assert any(n.startswith("moe_imbalance 1.5 unused") for n in skew["notes"])
    assert not any(n.startswith("moe_imbalance") for n in plain["notes"])


def test_cli_ep_error_is_one_line():
    from _helpers import run_cli_here

    r = run_cli_here("predict", "--model", MIXTRAL, "--gpu", H100, "--pp", "1", "--dp", "6", "--ep", "6",
                     "--global-batch", "6")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "ep=6" in r.stderr


SMALL_MOE = "llama:layers=4,hidden=1024,heads=8,seq=512,vocab=32000,ffn=2048,experts=8,top_k=2"


def test_plan_searches_expert_parallelism():
    from perfsim.plan import SearchSpace, enumerate_candidates, plan

    # overlap pinned: with it searched, the better incumbent prunes one of the two by its bound
    space = SearchSpace(schedules=("1f1b",), compress=("fp32",), grad_compress=("none",), recompute=("none",),
                        overlap=False)
    known = {"model", "tp", "ep", "recompute"}
    cands = enumerate_candidates(n_layers=4, gpus=8, gpus_per_node=8, global_batch=16, space=space,
                                 base={}, known=known, experts=6)
    # every ep dividing both dp and the 6 experts (2 of dp 2, 4, 8; never 4 or 8)
    assert {(c["dp"], c.get("ep", 1)) for c in cands} >= {(2, 2), (2, 1), (4, 1), (4, 2), (8, 1), (8, 2)}
    assert all(c["dp"] % c.get("ep", 1) == 0 and 6 % c.get("ep", 1) == 0 for c in cands)
    assert not any(c.get("ep", 1) in (3, 4, 6, 8) for c in cands)
    assert not any("ep" in c for c in enumerate_candidates(n_layers=4, gpus=8, gpus_per_node=8, global_batch=16,
                                                           space=space, base={}, known=known))
    res = plan(model=SMALL_MOE, gpus_per_node=4, global_batch=16, gpu=H100, precision="bf16", space=space)
    # both were simulated (the wider plan space -- ZeRO, attention, ... -- fills the top five
    # with variants of one of them)
    seen = [c.params for c in res.all_evaluated if c.summary is not None]
    assert any(p.get("ep", 1) > 1 for p in seen) and any(p.get("ep", 1) == 1 for p in seen)


def test_expert_parallel_and_expert_data_parallel_groups():
    """Megatron-Core's layout, dp 8, ep 2: EP groups of consecutive replicas {0,1} {2,3} ...,
    expert-data-parallel groups of the replicas holding the same experts {0,2,4,6} {1,3,5,7};
    each replica in one of each, an EP group and an expert-DP group meet in one replica; with
    ep = dp every expert-DP group is one replica."""
    from perfsim.config import Strategy
    from perfsim.models.moe import ep_replicas, expert_dp_replicas

    dp, ep = 8, 2
    groups = [list(ep_replicas(ep, g)) for g in range(dp // ep)]
    assert groups == [[0, 1], [2, 3], [4, 5], [6, 7]]
    edp = {tuple(expert_dp_replicas(dp, ep, r)) for r in range(dp)}
    assert edp == {(0, 2, 4, 6), (1, 3, 5, 7)}
    assert all(len(set(g) & set(e)) == 1 for g in groups for e in edp)
    assert all(list(expert_dp_replicas(8, 8, r)) == [r] for r in range(8))
    # ranks under Megatron's placement (tp, dp, pp), tp 2: an EP group's tensor rank 0s are 2 apart
    st = Strategy(pp=2, dp=dp, tp=2, placement=("tp", "dp", "pp"), macro_batch=2, micro_batch=1)
    assert [st.device(0, r, 0) for r in ep_replicas(ep, 1)] == [4, 6]
    assert [st.device(1, r, 1) for r in expert_dp_replicas(dp, ep, 1)] == [19, 23, 27, 31]


def test_memory_answers_expert_parallelism_smaller_than_data_parallelism():
    """dp 8, ep 2: each rank holds
    experts / ep = 4 of Mixtral's 8 experts per block, the rest replicated. By hand against ep 8
    (one expert per rank, what predict also simulates): the weights differ by the routed
    experts' parameters x (1/2 - 1/8) x 2 bytes (bf16), the optimizer state by x 12 bytes, the
    activations not at all (each rank computes its tokens' top-k copies either way)."""
    from perfsim.analysis.memory_fit import memory_report
    from perfsim.api import predict

    job = dict(model=MIXTRAL, gpu=H100, tp=1, pp=1, dp=8, gpus_per_node=8, precision="bf16",
               recompute="full", global_batch=64, grad_buffer="bucketed")
    spec = from_hf_config(MIXTRAL)
    experts = sum(spec.experts * spec.mlp_params(spec.expert_ffn) for i in range(spec.n_layer)
                  if spec.is_moe_block(i))
    two, eight = memory_report(**job, ep=2), memory_report(**job, ep=8)
    extra = experts * (1 / 2 - 1 / 8)
    assert two.breakdown["weights"] - eight.breakdown["weights"] == pytest.approx(2 * extra, rel=1e-9)
    assert two.breakdown["optimizer state"] - eight.breakdown["optimizer state"] == pytest.approx(12 * extra,
                                                                                                  rel=1e-9)
    assert two.breakdown["activations"] == eight.breakdown["activations"]
    assert eight.peak_bytes / GIB == pytest.approx(predict(**job, ep=8, allow_oom=True).summary["peak_memory_gib"])
    assert "--ep 4" in two.options_by_flags()
    # and predict simulates it with the same memory (the experts' sync: tests/engine/test_expert_dp_sync.py)
    assert two.peak_bytes / GIB == pytest.approx(predict(**job, ep=2, allow_oom=True).summary["peak_memory_gib"])


@pytest.mark.parametrize("ep", [4, 8])
def test_zero1_shards_the_experts_state_over_their_own_group(ep):
    """ZeRO-1 with expert parallelism (Megatron-Core's distributed optimizer; DeepSeek-V3's
    training): the dense parameters' Adam state over all 8 replicas, the experts' over the
    dp / ep replicas holding the same experts -- none with ep == dp."""
    from perfsim import memory_report, predict
    from perfsim.models.moe import expert_params_per_rank

    spec = from_hf_config(MIXTRAL)
    job = {**EP, "ep": ep}
    plain, sharded = memory_report(**job), memory_report(**job, zero=1)
    weights = plain.breakdown["weights"] / 2  # bf16 weights: the rank's parameters
    experts = sum(expert_params_per_rank(spec, 1, ep, i) for i in range(spec.n_layer))
    assert plain.breakdown["optimizer state"] == pytest.approx(12 * weights)
    assert sharded.breakdown["optimizer state"] == pytest.approx(12 * ((weights - experts) / 8 + experts / (8 // ep)))
    a, b = predict(**job, allow_oom=True).summary, predict(**job, zero=1, allow_oom=True).summary
    assert b["optimizer_s"] < a["optimizer_s"]
    # Megatron's distributed optimizer: the fp32 gradients reduce-scattered, the bf16 weights gathered,
    # 4 + 2 bytes where the all-reduce moved 2 x 4, in the dense and the experts' groups alike
    assert b["dp_bytes"] == pytest.approx(0.75 * a["dp_bytes"], rel=1e-6)
