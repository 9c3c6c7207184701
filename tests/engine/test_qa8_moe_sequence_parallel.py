"""qa8: expert all-to-alls under tensor + sequence parallelism (Megatron-Core's layout).

Megatron-Core requires sequence parallelism for a MoE with tp > 1; its
``MoEAlltoAllTokenDispatcher`` sends each rank's own sequence shard ("num_local_tokens:
S/TP*B") over the expert-parallel group and all-gathers what arrives over the
tensor-parallel group (reduce-scatter on the way back). perfsim sent every token's copies
from every tensor-parallel rank (tp x the all-to-all bytes) and gathered the MLP's input
once a token: Mixtral-8x7B tp 2 pp 4 dp 8 ep 8 on 64 H100 (400 Gbps, bf16, mb 1) with
sequence parallelism predicted 2.348 s (ep_bytes 962 GB); now 1.864 s (481 GB, the TP
collectives 550 -> 829 GB).
"""

import pytest

import perfsim
from perfsim.models.tensor_parallel import tp_layer_collectives

MOE = "llama:layers=2,hidden=1024,heads=8,seq=512,vocab=1000,ffn=2048,experts=8,top_k=2"
JOB = dict(model=MOE, gpu="h100", gpus_per_node=2, tp=2, pp=1, dp=4, global_batch=8, micro_batch=1,
           precision="bf16", grad_compress="none", bandwidth="100Gbps", attention="flash")


def _summary(**kw):
    return perfsim.predict(**{**JOB, **kw}).summary


def test_the_all_to_all_carries_each_ranks_sequence_shard():
    full = _summary(ep=4, sequence_parallel=False)
    sp = _summary(ep=4, sequence_parallel=True)
    assert sp["ep_bytes"] == pytest.approx(full["ep_bytes"] / 2, rel=1e-12)  # tp = 2
    assert sp["ep_comm_s"] < 0.75 * full["ep_comm_s"]


def test_the_tensor_parallel_group_gathers_the_routed_copies():
    # ep 1: the dense pattern (no all-to-all dispatcher); ep 4: the MLP's gather and scatter carry
    # top_k = 2 copies a token, the attention's one: (1 + 2) / (1 + 1) of the blocks' TP bytes
    dense = _summary(ep=1, sequence_parallel=True)
    moe = _summary(ep=4, sequence_parallel=True)
    blocks = tp_layer_collectives(1024, 512, 1, 2, True, 2)
    routed = tp_layer_collectives(1024, 512, 1, 2, True, 2, mlp_rows=2.0)
    assert [n for *_, n in routed].count(2 * blocks[1][2]) == 2  # the MLP's forward and backward scatters
    assert sum(n for *_, n in routed) == pytest.approx(1.5 * sum(n for *_, n in blocks))
    extra = moe["tp_bytes"] - dense["tp_bytes"]
    assert extra > 0 and _summary(ep=4, sequence_parallel=False)["tp_bytes"] == \
        _summary(ep=1, sequence_parallel=False)["tp_bytes"]  # without SP: unchanged
