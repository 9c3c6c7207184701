"""Memory per GPU: Korthikanti et al. 2022 (arXiv:2205.05198) activations, ZeRO model states."""

import pytest

from perfsim.api import predict
from perfsim.errors import ConfigError
from perfsim.memory import GIB, layer_activation_bytes
from perfsim.models.transformer import parse_inline

GPT = parse_inline("gpt:layers=96,hidden=12288,heads=96,seq=2048,vocab=51200")
s, b, h, a, t = 2048, 1, 12288, 96, 8


@pytest.mark.parametrize("recompute,sp,expected", [
    ("none", False, s * b * h * (10 + 24 / t + 5 * a * s / (h * t))),  # paper eq. (2)
    ("none", True, s * b * h / t * (34 + 5 * a * s / h)),               # eq. (4)
    ("selective", False, s * b * h * (10 + 24 / t)),
    ("selective", True, s * b * h * 34 / t),                            # eq. (5)
    ("full", False, 2 * s * b * h),
    ("full", True, 2 * s * b * h / t),
])
def test_activation_formula_matches_the_paper(recompute, sp, expected):
    assert layer_activation_bytes(GPT, b, t, sp, recompute, 2) == pytest.approx(expected)


def test_hand_computed_stage_memory():
    """GPT-3 175B, TP 8, PP 8, 1F1B, bf16, ZeRO off, full recompute, micro-batch 1, by hand:
    stage 1 (blocks only) holds 12 blocks; per GPU Psi = 12 x block/8 (+ norms/biases
    replicated); 18 bytes per parameter (Megatron keeps bf16 gradients in an fp32 buffer);
    activations 2 s b h per block x 7 micro-batches in flight (pp - stage) + one block's
    full activations during recomputation."""
    r = predict(model="gpt:layers=96,hidden=12288,heads=96,seq=2048,vocab=51200", gpu="a100-sxm4-80gb",
                tp=8, pp=8, dp=1, micro_batch=1, global_batch=64, gpus_per_node=8, precision="bf16",
                recompute="full", partition="13,12,12,12,12,12,12,13", attention="megatron")
    st = r.stages[1]
    assert st["layers"] == "13-24"
    per_block = (12 * h * h) / 8 + (3 * h + 4 * h) / 8 + (4 * h + 2 * h)  # GEMMs + col. biases / 8, norms + row biases
    psi = 12 * per_block
    assert st["weights_gib"] * GIB == pytest.approx(2 * psi)
    assert st["grads_gib"] * GIB == pytest.approx(4 * psi)
    assert st["optimizer_state_gib"] * GIB == pytest.approx(12 * psi)
    act = 12 * 2 * s * b * h * 7 + s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    assert st["activations_gib"] * GIB == pytest.approx(act)
    assert st["memory_gib"] == pytest.approx((18 * psi + act) / GIB)
    assert r.summary["peak_memory_gib"] == max(x["memory_gib"] for x in r.stages)
    assert r.summary["fits"] is True


def test_gradient_dtype_follows_the_buffer():
    """bf16 gradients live (and are all-reduced) in fp32 in Megatron's contiguous buffer,
    16-bit in PyTorch DDP's buckets and under fp16: memory and data-parallel bytes agree."""
    base = dict(model="gpt2-xl", gpu="a100-sxm4-80gb", pp=2, dp=4, micro_batch=1, global_batch=64)
    runs = {(p, g): predict(**base, precision=p, grad_buffer=g)
            for p in ("bf16", "fp16") for g in ("contiguous", "bucketed")}
    w = runs["fp16", "contiguous"].stages[0]["weights_gib"]
    assert runs["bf16", "contiguous"].stages[0]["grads_gib"] == pytest.approx(2 * w)
    for key in (("bf16", "bucketed"), ("fp16", "contiguous"), ("fp16", "bucketed")):
        assert runs[key].stages[0]["grads_gib"] == pytest.approx(w)
    dp = {k: r.summary["dp_bytes"] for k, r in runs.items()}
    assert dp["bf16", "contiguous"] == pytest.approx(2 * dp["fp16", "contiguous"])
    assert dp["bf16", "bucketed"] == pytest.approx(dp["fp16", "contiguous"])


def test_zero1_gathers_the_updated_weights():
    """ZeRO-1 adds an all-gather of the 16-bit weights after the gradient exchange; over
    Megatron's contiguous buffer the all-reduce becomes a reduce-scatter (bf16: 4 + 2
    bytes per parameter instead of 4 + 4), beside PyTorch DDP's buckets it stays."""
    base = dict(model="gpt2-xl", gpu="a100-sxm4-80gb", pp=2, dp=4, micro_batch=1, global_batch=64)

    def dp_bytes(**kw):
        return predict(**base, **kw).summary["dp_bytes"]

    assert dp_bytes(precision="bf16", zero=1) == pytest.approx(0.75 * dp_bytes(precision="bf16"), rel=1e-6)
    assert dp_bytes(precision="fp16", zero=1) == pytest.approx(dp_bytes(precision="fp16"), rel=1e-6)
    for prec in ("fp16", "bf16"):
        kw = dict(precision=prec, grad_buffer="bucketed")
        assert dp_bytes(**kw, zero=1) == pytest.approx(1.5 * dp_bytes(**kw), rel=1e-6)
    # a compressor keeps its own exchange; the gather of the weights comes on top
    q = dict(precision="fp16", grad_compress="qsgd-maxnorm:4")
    # every rank receives the (dp - 1) other shards of its stage: summed, (dp - 1) x 2 bytes x
    # the parameters, the last stage's copy of the tied embedding (50257 x 1600) included
    gathered = (4 - 1) * 2 * (predict(**base, **q).summary["params"] + 50257 * 1600)
    assert dp_bytes(**q, zero=1) - dp_bytes(**q) == pytest.approx(gathered, rel=1e-4)


def test_last_stage_syncs_its_copy_of_the_tied_embedding():
    """With pp > 1 the last stage holds its own copy of the tied word embedding (Megatron):
    stored, stepped and all-reduced over dp like its other weights."""
    base = dict(model="gpt2-xl", gpu="a100-sxm4-80gb", dp=2, micro_batch=1, global_batch=64, precision="fp16")
    one, two = predict(**base, pp=1), predict(**base, pp=2)
    copy = 50257 * 1600
    # dp 2 ring all-reduce: each rank sends its whole 2-byte buffer once; two ranks per stage
    assert one.summary["dp_bytes"] == pytest.approx(2 * 2 * one.summary["params"], rel=1e-9)
    assert two.summary["dp_bytes"] - one.summary["dp_bytes"] == pytest.approx(2 * 2 * copy, rel=1e-9)
    weights = sum(st["weights_gib"] for st in two.stages) * GIB
    assert weights == pytest.approx(2 * (two.summary["params"] + copy), rel=1e-9)


TIED = dict(model="gpt:layers=4,hidden=1024,heads=16,seq=1024,vocab=50304", gpu="a100", micro_batch=1,
            global_batch=8, pp=2, gpus_per_node=1, bandwidth="10Gbps")


@pytest.mark.parametrize("tp,precision,value_bytes", [(1, "fp16", 2), (2, "bf16", 4)])
def test_tied_embedding_gradient_is_allreduced_between_first_and_last_stage(tp, precision, value_bytes):
    """Megatron all-reduces the tied embedding's gradient (vocab/tp x hidden values of the
    main gradient: fp32 under bf16) between the first and the last stage after the
    data-parallel sync; ``untied`` (perfsim run's convention) does not."""
    from perfsim.api import build_configs
    from perfsim.engine.plan import build_plan
    from perfsim.hardware import get_gpu
    from perfsim.network import Network

    kw = dict(TIED, tp=tp, precision=precision)
    synced, untied = predict(**kw), predict(**kw, tied_embedding="untied")
    nbytes = 50304 // tp * 1024 * value_bytes
    workload, strategy, system, profile = build_configs(**kw, dp=2)
    network = Network(system, strategy.devices, profile)
    plan = build_plan(workload, strategy, profile, network, get_gpu("a100"))
    assert plan.tied_sync_bytes == nbytes
    # dp 1: the whole difference is that all-reduce, counted as gradient sync; a 2-rank
    # ring sends each rank's buffer once per tensor rank over the one 10 Gbps NIC
    extra = synced.summary["iteration_s"] - untied.summary["iteration_s"]
    assert untied.summary["dp_sync_s"] == 0 and synced.summary["dp_sync_s"] == pytest.approx(extra)
    wire = tp * nbytes * 8 / 10e9
    assert wire < extra < 1.1 * wire
    assert synced.summary["dp_bytes"] == untied.summary["dp_bytes"]
    # both stages' tensor ranks send their whole buffer once (2-rank ring), every iteration
    assert synced.summary["tied_bytes"] == 2 * tp * nbytes and untied.summary["tied_bytes"] == 0


def test_tied_embedding_sync_only_where_a_tied_head_is_split_off():
    base = dict(TIED, precision="fp16")
    for kw in (dict(pp=1), dict(model="llama:layers=4,hidden=1024,heads=16,seq=1024,vocab=32000")):
        a, b = predict(**{**base, **kw}), predict(**{**base, **kw}, tied_embedding="untied")
        assert a.summary["iteration_s"] == b.summary["iteration_s"]
    # without a gpu preset perfsim follows its runtime (stages untied)
    cpu = dict(model="gpt2", pp=2, dp=1, bandwidth="100Mbps")
    assert predict(**cpu).summary == predict(**cpu, tied_embedding="untied").summary
    assert predict(**cpu, tied_embedding="sync").summary["iteration_s"] > predict(**cpu).summary["iteration_s"]
    with pytest.raises(ConfigError, match="tied_embedding='shared'"):
        predict(**base, tied_embedding="shared")


def test_zero1_schedule_and_aqsgd_buffers():
    base = dict(model="gpt2-xl", gpu="a100-sxm4-40gb", pp=4, dp=4, micro_batch=1, global_batch=64,
                precision="fp16")
    plain, zero = predict(**base), predict(**base, zero=1)
    assert zero.stages[0]["optimizer_state_gib"] == pytest.approx(plain.stages[0]["optimizer_state_gib"] / 4)
    gpipe, f1b = predict(**base, schedule="gpipe", allow_oom=True), predict(**base, schedule="1f1b")
    assert gpipe.stages[0]["activations_gib"] == pytest.approx(4 * f1b.stages[0]["activations_gib"])  # 16 vs 4
    aq = predict(**base, compress="aqsgd:fw3bw6:m8", dataset_samples=1000, allow_oom=True)
    # middle stage: sender and receiver buffers, 1000 samples x 1024 x 1600 x 1 byte each
    assert aq.stages[1]["buffers_gib"] * GIB == pytest.approx(2 * 1000 * 1024 * 1600)
    assert aq.stages[0]["buffers_gib"] * GIB == pytest.approx(1000 * 1024 * 1600)
    # the last stage receives the previous stage's output (not its own vocabulary-wide logits)
    assert aq.stages[-1]["buffers_gib"] * GIB == pytest.approx(1000 * 1024 * 1600)
    disk = predict(**base, compress="aqsgd:fw3bw6:m8:disk=/tmp/x", dataset_samples=1000)
    assert disk.stages[1]["buffers_gib"] == 0


def test_every_micro_batch_in_flight_keeps_its_loss():
    """The last stage's norm and head inputs and its fp32 softmax are kept by every micro-batch
    waiting for its backward: GPipe's last stage holds all 32 of the AQ-SGD setup (the default
    predict: GPT2-XL, pp 8, micro-batch 1 x 1024 tokens, fp32), 1F1B's one. fp32 training
    doubles the 2-byte inputs, not the softmax, which is fp32 in both (Korthikanti et al.
    Sec. 4.3: 4 s b h (1 + v/h) for 16-bit values)."""
    from perfsim.api import build_configs
    from perfsim.memory import loss_bytes

    workload = build_configs()[0]
    spec = workload.arch
    s, h, v = spec.seq_len, spec.hidden, spec.vocab
    assert loss_bytes(spec, 1, 1, 4, "fused", 32) == 32 * (8 * s * h + 4 * s * v)
    assert loss_bytes(spec, 1, 1, 2, "fused") == pytest.approx(4 * s * h * (1 + v / h))
    # pytorch: the backward's fp32 logit gradient once; chunked: one chunk and one weight gradient
    one, many = (loss_bytes(spec, 1, 1, 2, "pytorch", n) for n in (1, 5))
    assert many - one == pytest.approx(4 * (2 * 2 * s * h + 8 * s * v))
    one, many = (loss_bytes(spec, 1, 1, 2, "chunked", n) for n in (1, 5))
    assert many - one == pytest.approx(4 * (2 * 2 * s * h + 2 * s * h))
    per_block = layer_activation_bytes(spec, 1, 1, False, "none", 4)
    for schedule, held in (("gpipe", 32), ("1f1b", 1)):
        st = predict(schedule=schedule, recompute="none").stages[-1]
        first, last = (int(x) for x in st["layers"].split("-"))
        blocks = sum(1 for layer in workload.layers[first:last + 1] if layer.name.startswith("block"))
        assert (blocks, st["peak_inflight"]) == (6, held)
        assert st["activations_gib"] * GIB == pytest.approx(blocks * held * per_block + held * (8 * s * h + 4 * s * v))


def test_aqsgd_buffers_are_those_of_the_boundaries_that_cross_devices():
    """qa3: AQ-SGD's per-sample buffers were counted with the pipeline's device count as its
    stage count: an interleaved pp 2 x 2 chunks charged 2 boundary buffers per device where it
    sends over 3 (stage 1 -> 2 crosses too), an interleaved pp 1 charged one for its chunks'
    local hand-off (no message, no codec: perfsim.schedules, the runtime's pipeline)."""
    aq = dict(model="gpt2-tiny", compress="aqsgd:fw3bw6", dataset_samples=1000)
    one = GIB * predict(**aq, pp=2, schedule="1f1b").stages[0]["buffers_gib"]  # one boundary's buffer

    def buffers(**kw):
        return [round(GIB * s["buffers_gib"] / one, 6) for s in predict(**aq, **kw).stages]

    assert buffers(pp=2, schedule="interleaved-1f1b", virtual_stages=2) == [3, 3]
    assert buffers(pp=1, schedule="interleaved-1f1b", virtual_stages=2) == [0]
    assert buffers(pp=2, schedule="zb-v") == [2, 2]  # the V's turn (stages 1, 2 on device 1) is local
    assert buffers(pp=3, schedule="1f1b") == [1, 2, 1]


def test_aqsgd_buffers_follow_the_per_boundary_specs():
    """qa6: the memory model charged AQ-SGD's buffers by --compress alone: AQ-SGD on the only
    boundary through --boundary-compress 0=aqsgd:fw3bw6 (the same 311,296 pipeline bytes as
    --compress aqsgd:fw3bw6) had no buffers (peak 0.051 GiB against 0.274), and --compress
    aqsgd:fw3bw6 with every boundary overridden by fp16 kept them. Each boundary's own spec now
    decides its sender's and its receiver's buffers."""
    aq = dict(model="gpt2-tiny", dataset_samples=1000, schedule="1f1b")
    one = GIB * predict(**aq, pp=2, compress="aqsgd:fw3bw6").stages[0]["buffers_gib"]  # one boundary's buffer
    assert one > 0

    def buffers(**kw):
        return [round(GIB * s["buffers_gib"] / one, 6) for s in predict(**aq, **kw).stages]

    assert buffers(pp=2, boundary_compress="0=aqsgd:fw3bw6") == [1, 1]
    assert buffers(pp=2, compress="aqsgd:fw3bw6", boundary_compress="0=fp16") == [0, 0]
    assert buffers(pp=3, compress="aqsgd:fw3bw6", boundary_compress="1=fp16") == [1, 1, 0]
    assert buffers(pp=3, boundary_compress="1=aqsgd:fw3bw6") == [0, 1, 1]
