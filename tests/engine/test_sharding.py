"""ZeRO-2/3 and FSDP2: memory against the ZeRO paper's formulas, wire bytes against the
ring formulas, refusals; the fp32 logits of a plain PyTorch step; fp8 on Hopper."""

import json
import math
from pathlib import Path

import pytest

from perfsim.api import predict
from perfsim.cli import main
from perfsim.errors import ConfigError
from perfsim.memory import GIB, model_state_bytes, sharding_buffers

GB = 1e9


# ---------------------------------------------------------------- memory: ZeRO Sec. 5

def paper(psi: float, nd: int, stage: int, k: int = 12) -> float:
    """Rajbhandari et al., arXiv:1910.02054, Sec. 5 / Fig. 1 (mixed-precision Adam, K = 12)."""
    return {0: (2 + 2 + k) * psi, 1: (2 + 2 + k / nd) * psi, 2: (2 + (2 + k) / nd) * psi,
            3: (2 + 2 + k) * psi / nd}[stage]


def test_figure_1_numbers():
    """The paper's Fig. 1 example: Psi = 7.5B, N_d = 64: 120, 31.4, 16.6 and 1.9 GB."""
    got = [sum(model_state_bytes(7.5e9, 2, 2, 12, 64, z)) / GB for z in range(4)]
    assert got == pytest.approx([120, 31.4, 16.6, 1.9], abs=0.05)


@pytest.mark.parametrize("psi", [124_439_808, 1_557_611_200, 7.5e9, 175e9])
@pytest.mark.parametrize("nd", [1, 2, 8, 64, 1024])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_model_states_follow_the_paper(psi, nd, stage):
    assert sum(model_state_bytes(psi, 2, 2, 12, nd, stage)) == pytest.approx(paper(psi, nd, stage), rel=1e-12)


@pytest.mark.parametrize("model", ["gpt2", "gpt2-medium"])
@pytest.mark.parametrize("dp", [2, 4, 8])
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_predicted_model_states_follow_the_paper(model, dp, zero):
    """End to end: predict's weights + grads + optimizer of a stage equal the formula for the
    stage's Psi (16-bit gradients in DDP-style buckets, the paper's 2 Psi), and fp32
    training's with K = 8 (and 4-byte weights and gradients)."""
    base = dict(model=model, gpu="h100", pp=1, dp=dp, gpus_per_node=8, micro_batch=1,
                global_batch=8 * dp, grad_buffer="bucketed", zero=zero, attention="flash")
    st = predict(**base, precision="bf16").stages[0]
    psi = st["params"]
    states = (st["weights_gib"] + st["grads_gib"] + st["optimizer_state_gib"]) * GIB
    assert states == pytest.approx(paper(psi, dp, zero), rel=1e-9)
    st32 = predict(**base, precision="fp32").stages[0]
    states32 = (st32["weights_gib"] + st32["grads_gib"] + st32["optimizer_state_gib"]) * GIB
    w = {0: 16 * psi, 1: (8 + 8 / dp) * psi, 2: (4 + 12 / dp) * psi, 3: 16 * psi / dp}[zero]
    assert states32 == pytest.approx(w, rel=1e-9)


def test_zero3_working_buffers_are_stated():
    """ZeRO-3 adds the gathered weights of the computing and the prefetched unit (largest
    adjacent pair) and one unit's unsharded gradient; without resharding, the whole
    stage's gathered weights; ZeRO-2 one unit's gradient; nothing at dp 1 or ZeRO-0/1."""
    units = [10, 50, 30, 40]
    assert sharding_buffers(units, 2, 2, 8, 3) == 2 * (50 + 30) + 2 * 50
    assert sharding_buffers(units, 2, 4, 8, 3, reshard_after_forward=False) == 2 * 130 + 4 * 50
    assert sharding_buffers(units, 2, 2, 8, 2) == 2 * 50
    assert sharding_buffers(units, 2, 2, 1, 3) == 0
    assert sharding_buffers(units, 2, 2, 8, 1) == 0
    # in a prediction: GPT-2's largest adjacent pair is the embedding (wte + wpe) and block 0
    r = predict(model="gpt2", gpu="h100", pp=1, dp=4, gpus_per_node=4, micro_batch=1, global_batch=8,
                precision="bf16", grad_buffer="bucketed", zero=3, attention="flash")
    embed, block = 50257 * 768 + 1024 * 768, 12 * 768 * 768 + 13 * 768
    assert r.stages[0]["sharding_buffers_gib"] * GIB == 2 * (embed + block) + 2 * embed
    assert r.summary["peak_memory_gib"] == pytest.approx(r.stages[0]["memory_gib"])


def test_zero3_lowers_the_peak_and_no_reshard_costs_memory():
    base = dict(model="gpt2-xl", gpu="h100", pp=1, dp=8, gpus_per_node=8, micro_batch=1, global_batch=16,
                precision="bf16", attention="flash", grad_buffer="bucketed")
    peak = {z: predict(**base, zero=z).summary["peak_memory_gib"] for z in range(4)}
    assert peak[0] > peak[1] > peak[2] > peak[3]
    keep = predict(**base, zero=3, reshard_after_forward=False).summary["peak_memory_gib"]
    assert peak[3] < keep < peak[2] + 2 * 1.56e9 / GIB


# ---------------------------------------------------------------- communication

def wire(kind: str, nbytes: float, n: int) -> float:
    """Ring bytes one rank sends (arXiv:1910.02054 Sec. 7; perfsim.collectives.plan)."""
    return {"allgather": (n - 1) * nbytes, "reduce_scatter": (n - 1) / n * nbytes,
            "allreduce": 2 * (n - 1) / n * nbytes}[kind]


def _layer_params(model: str) -> list[int]:
    from perfsim.api import build_configs

    workload = build_configs(model=model, gpu="h100", pp=1)[0]
    return [layer.params for layer in workload.layers]


@pytest.mark.parametrize("dp", [2, 4])
@pytest.mark.parametrize("m", [1, 3])
def test_wire_bytes_per_iteration(dp, m):
    """dp_bytes (all ranks, one iteration) = the ring formulas, unit by unit:
    ZeRO-2: m reduce-scatters of the gradients + one all-gather of the updated weights;
    ZeRO-3: m x (all-gather in forward + again in backward + reduce-scatter);
    without resharding one all-gather per forward only; ZeRO-0/1 unchanged."""
    model = "gpt2"
    units = [p for p in _layer_params(model) if p]
    psi = sum(units)
    base = dict(model=model, gpu="h100", pp=1, dp=dp, gpus_per_node=8, micro_batch=1, global_batch=m * dp,
                precision="bf16", grad_buffer="bucketed", attention="flash")
    got = {z: predict(**base, zero=z).summary["dp_bytes"] for z in (0, 2, 3)}
    got["3k"] = predict(**base, zero=3, reshard_after_forward=False).summary["dp_bytes"]
    rs = sum(wire("reduce_scatter", 2 * p, dp) for p in units)
    ag = sum(wire("allgather", math.ceil(2 * p / dp), dp) for p in units)
    assert got[0] == pytest.approx(dp * wire("allreduce", 2 * psi, dp), rel=1e-9)
    assert got[2] == pytest.approx(dp * (m * rs + wire("allgather", math.ceil(2 * psi / dp), dp)), rel=1e-12)
    assert got[3] == pytest.approx(dp * m * (2 * ag + rs), rel=1e-12)
    assert got["3k"] == pytest.approx(dp * m * (ag + rs), rel=1e-12)
    if m == 1:  # the paper's Sec. 7.2: ZeRO-2 = DP, ZeRO-3 = 1.5 x DP (up to the shards' rounding)
        assert got[2] == pytest.approx(got[0], rel=1e-6)
        assert got[3] == pytest.approx(1.5 * got[0], rel=1e-6)


def test_compressed_reduce_scatter_and_refusals(capsys):
    """A compressor whose codes sum on a shared scale reduce-scatters them; the others
    are refused in one line naming the compressor (exit 2)."""
    base = dict(model="gpt2", gpu="h100", pp=1, dp=4, gpus_per_node=4, micro_batch=1, global_batch=4,
                precision="bf16", grad_buffer="bucketed", attention="flash")
    plain = predict(**base, zero=3).summary["dp_bytes"]
    q = predict(**base, zero=3, grad_compress="qsgd-maxnorm:4").summary["dp_bytes"]
    assert q < plain
    for spec in ("qsgd:4", "powersgd:4", "onebit-adam", "randk-maxnorm:0.01:4", "topk:0.2:8"):
        with pytest.raises(ConfigError, match="cannot reduce-scatter"):
            predict(**base, zero=2, grad_compress=spec)
    code = main(["predict", "--model", "gpt2", "--gpu", "h100", "--pp", "1", "--dp", "2", "--zero", "3",
                 "--grad-compress", "qsgd:4", "--precision", "bf16"])
    out, err = capsys.readouterr()
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "qsgd:4" in lines[0] and "reduce-scatter" in lines[0], err


def test_zero3_overlaps_gathers_with_compute():
    """On a fast fabric the per-unit gathers hide behind compute (ZeRO-3 within 10 % of the
    same replica's iteration without data parallelism); over a slow network they are
    exposed: every unit waits for its gather, so the iteration is at least the gathers'
    serial time (2 micro-batches, forward and backward)."""
    base = dict(model="gpt2", gpu="h100", pp=1, micro_batch=4, precision="bf16",
                grad_buffer="bucketed", attention="flash")
    alone = predict(**base, dp=1, global_batch=8).summary["iteration_s"]
    t3 = predict(**base, dp=2, global_batch=16, gpus_per_node=2, zero=3).summary["iteration_s"]
    assert t3 < 1.1 * alone
    slow = predict(**base, dp=2, global_batch=16, zero=3, bandwidth="1Gbps", gpus_per_node=1)
    units = [p for p in _layer_params("gpt2") if p]
    gathers = sum(wire("allgather", math.ceil(2 * p / 2), 2) for p in units) * 8 / 1e9  # seconds at 1 Gbit/s
    assert slow.summary["iteration_s"] > 2 * 2 * gathers
    assert slow.summary["dp_sync_s"] > 0.5 * 2 * 2 * gathers


def test_zero_refuses_zero_bubble_schedules():
    with pytest.raises(ConfigError, match="zero-bubble"):
        predict(model="gpt2", gpu="h100", pp=2, dp=2, zero=3, schedule="zb-h1", global_batch=8)


# ---------------------------------------------------------------- the loss's memory

#: a plain PyTorch GPT-2 124M step on one H100 (fp32 parameters, bf16 autocast, SDPA
#: attention, fp32 F.cross_entropy over the 50257-token vocabulary, AdamW, micro-batch 16 x
#: 1024 tokens): traces/gpu/h100-memory-fp8-2026-11-27.json (scripts/gpu_memory_fp8.py)
PLAIN_STEP = dict(model="gpt2", gpu="h100", pp=1, micro_batch=16, macro_batch=16, precision="bf16",
                  attention="flash", grad_buffer="bucketed")
MEASURED = Path(__file__).parents[2] / "traces" / "gpu" / "h100-memory-fp8-2026-11-27.json"
BLOCKS = MEASURED.with_name("h100-block-activations-2026-11-27.json")


def test_pytorch_cross_entropy_adds_the_fp32_logits_and_their_gradient():
    """F.cross_entropy under autocast holds the bf16 logits, the fp32 log-softmax, another
    bf16-sized buffer and, at its backward peak, an fp32 gradient of the logits: 12 bytes per
    logit where Megatron's fused loss keeps 4 (Korthikanti et al. Sec. 4.3); the chunked loss
    never holds the logits."""
    from perfsim.api import build_configs

    vocab = build_configs(**PLAIN_STEP)[0].arch.vocab
    act = {ce: predict(**PLAIN_STEP, cross_entropy=ce).stages[0]["activations_gib"] * GIB
           for ce in ("fused", "pytorch", "chunked")}
    assert act["pytorch"] - act["fused"] == pytest.approx(8 * 16 * 1024 * vocab, rel=1e-9)
    h, tok = 768, 16 * 1024
    chunk = 2 ** math.ceil(math.log2(math.ceil(tok / math.ceil(vocab / h))))
    saved = 4 * tok * vocab - (2 * chunk * vocab + 2 * tok * h + 4 * vocab * h)
    assert act["fused"] - act["chunked"] == pytest.approx(saved, rel=1e-9)


def test_the_measured_loss_memory_is_12_bytes_per_logit():
    """The H100 measurements behind the ``pytorch`` accounting: after the forward the step
    holds its states, the blocks' activations (measured alone: 37.3 bytes per s b h and
    block under autocast), the embedding's and the head's inputs and 8 bytes per logit;
    its peak sits 4 bytes per logit higher, 2 lower when the caller drops the logits."""
    data = json.loads(MEASURED.read_text())
    blocks = json.loads(BLOCKS.read_text())["autocast"]
    steps = {s["keep_logits"]: s for s in data["steps"]}
    logit = 16 * 1024 * 50257 / GIB  # GiB per byte per logit
    sbh = 16 * 1024 * 768
    keep, drop = steps[True], steps[False]
    held = (keep["after_forward_gib"] - keep["states_gib"]) * GIB
    held -= blocks["L12"] - blocks["L0"] + 4 * sbh + 2 * sbh + 2 * 50257 * 768  # + embed out, head input, wte cast
    assert held / GIB / logit == pytest.approx(8, abs=0.05)
    assert (keep["peak_allocated_gib"] - keep["after_forward_gib"]) / logit == pytest.approx(4, abs=0.05)
    assert (keep["peak_allocated_gib"] - drop["peak_allocated_gib"]) / logit == pytest.approx(2, abs=0.05)
    # the Korthikanti et al. block accounting holds for bf16 blocks (32 = 34 less 2 bytes of
    # dropout masks, which this model has not); autocast keeps 5 bytes more
    assert json.loads(BLOCKS.read_text())["bf16"]["per_block_bytes_per_sbh"] == pytest.approx(32, abs=0.2)
    assert blocks["per_block_bytes_per_sbh"] == pytest.approx(37.3, abs=0.1)


def test_plain_pytorch_step_near_the_measured_peak():
    """The modelled peak of the plain step against the H100's peak allocation (16.05 GiB):
    within 5 %; Megatron's fused loss accounting would say 9.8 GiB."""
    measured = json.loads(MEASURED.read_text())["steps"][0]["peak_allocated_gib"]
    peak = predict(**PLAIN_STEP, cross_entropy="pytorch").summary["peak_memory_gib"]
    assert abs(peak - measured) / measured < 0.05
    assert predict(**PLAIN_STEP).summary["peak_memory_gib"] < 0.65 * measured


# ---------------------------------------------------------------- fp8 on Hopper

def test_fp8_only_where_the_gpu_has_it(capsys):
    for gpu in ("a100", "l4", "v100"):
        with pytest.raises(ConfigError, match="has no fp8"):
            predict(model="gpt2", gpu=gpu, pp=1, precision="fp8")
    with pytest.raises(ConfigError, match="needs a GPU preset"):
        predict(model="gpt2", pp=1, precision="fp8")
    assert main(["predict", "--model", "gpt2", "--gpu", "a100", "--pp", "1", "--precision", "fp8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fp8" in err[0]


def test_fp8_gemms_run_at_the_fp8_peak():
    """The block GEMMs at the fp8 dense peak (H100 SXM: 1978.9 TFLOPS, half the datasheet's
    sparse 3958) times the same efficiency curve; the attention GEMMs and the LM head stay
    bf16."""
    from perfsim.engine.compute import op_time
    from perfsim.hardware import curve_for, get_gpu
    from perfsim.models.ops import Op

    gpu = get_gpu("h100")
    curve = curve_for(gpu)[0]
    for name in ("qkv", "proj", "mlp_up", "mlp_down"):
        op = Op(name, m=16384, n=12288, k=12288)
        assert op_time(op, gpu, "fp8", curve, 2) == pytest.approx(op_time(op, gpu, "bf16", curve, 2) * 989.4 / 1978.9)
    for op in (Op("scores", m=2048, n=2048, k=128, batch=256), Op("lm_head", m=16384, n=50304, k=4096, lm_head=True)):
        assert op_time(op, gpu, "fp8", curve, 2) == op_time(op, gpu, "bf16", curve, 2)
    base = dict(model="llama2-7b", gpu="h100", pp=1, micro_batch=1, global_batch=4, attention="flash", allow_oom=True)
    assert predict(**base, precision="fp8").summary["iteration_s"] < predict(**base, precision="bf16").summary["iteration_s"]


def test_fp8_memory_adds_weight_copies_and_scaling_state():
    from perfsim.models.tensor_parallel import block_gemm_params

    base = dict(model="gpt2-medium", gpu="h100", pp=1, dp=2, micro_batch=1, global_batch=4, attention="flash")
    from perfsim.api import build_configs

    spec = build_configs(**base)[0].arch
    for zero in (0, 3):
        w = {p: predict(**base, precision=p, zero=zero).stages[0]["weights_gib"] * GIB for p in ("bf16", "fp8")}
        copies = 2 * 24 * block_gemm_params(spec) / (2 if zero == 3 else 1)
        state = 24 * 4 * 5 * (1024 + 2) * 4
        assert w["fp8"] - w["bf16"] == pytest.approx(copies + state, rel=1e-9)


@pytest.mark.parametrize("zero", [2, 3])
def test_every_replica_simulated_agrees_with_the_representative(zero):
    """The per-unit collectives start once every simulated replica has joined: simulating
    all three replicas gives the representative's iteration and bytes (one GPU per node,
    pipeline of 2, compute slowed while communicating)."""
    from perfsim.api import build_configs
    from perfsim.engine import simulate

    w, s, sy, p = build_configs(model="gpt2-medium", pp=2, dp=3, micro_batch=1, global_batch=12, zero=zero,
                                comm_slowdown=0.2, bandwidth="1Gbps")
    one, every = simulate(w, s, sy, p), simulate(w, s, sy, p, symmetric=False)
    assert (one.summary["replicas_simulated"], every.summary["replicas_simulated"]) == (1, 3)
    assert every.summary["iteration_s"] == pytest.approx(one.summary["iteration_s"], rel=1e-12)
    assert every.summary["dp_bytes"] == one.summary["dp_bytes"]
    assert one.summary["interference_s"] > 0


# ---------------------------------------------------------------- FSDP2 on CPU ranks

def _fsdp_worker(rank, port, m, mb, out_dir):
    """One rank of a 2-rank gloo job: digits-mlp, each layer (the simulator's unit) under
    torch's ``fully_shard`` and the whole stage as the root, ``m`` micro-batches of ``mb``
    samples in 1F1B's order (``F0 B0 F1 B1``) and in GPipe's (``F0 F1 B0 B1``), then one
    AdamW step; FSDP2's own default prefetch and execute mode's
    (:func:`perfsim.runtime.fsdp.shard_stage`) each. Records the input bytes of every
    all-gather and reduce-scatter FSDP2 issues, per (prefetch, order)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from _helpers import gloo_group, save_rank
    from perfsim.models.registry import get_model_spec
    from perfsim.runtime.fsdp import shard_stage
    from perfsim.runtime.models import build_stage

    sent = []

    def wrap(fn, kind):
        def call(*args, **kw):
            inp = kw.get("input", kw.get("input_tensor", args[1] if len(args) > 1 else None))
            sent.append((kind, inp.numel() * inp.element_size()))
            return fn(*args, **kw)
        return call

    names = {"allgather": ("all_gather_single", "all_gather_into_tensor"),
             "reduce_scatter": ("reduce_scatter_single", "reduce_scatter_tensor")}
    saved = {n: getattr(dist, n) for ns in names.values() for n in ns if hasattr(dist, n)}
    runs = {}
    with gloo_group(rank, 2, port):
        try:
            for kind, ns in names.items():
                for n in ns:
                    if n in saved:
                        setattr(dist, n, wrap(saved[n], kind))
            spec = get_model_spec("digits-mlp")
            gen = torch.Generator().manual_seed(rank)
            x = torch.randn(m, mb, spec.sizes[0], generator=gen)
            y = torch.randint(0, spec.sizes[-1], (m, mb), generator=gen)
            for prefetch in ("fsdp2-default", "perfsim-run"):
                for order in ("1f1b", "gpipe"):
                    stage = build_stage(spec, 1, 0, seed=0)
                    if prefetch == "perfsim-run":
                        shard_stage(stage, list(stage.layers), dist.group.WORLD, "cpu")
                    else:
                        for layer in stage.layers:
                            fully_shard(layer)
                        fully_shard(stage)
                    opt = torch.optim.AdamW(stage.parameters(), lr=1e-3)
                    sent.clear()
                    if order == "1f1b":
                        for i in range(m):
                            (stage.loss(stage(x[i]), y[i]) / m).backward()
                    else:
                        losses = [stage.loss(stage(x[i]), y[i]) / m for i in range(m)]
                        for loss in losses:
                            loss.backward()
                    opt.step()
                    runs[prefetch, order] = list(sent)
        finally:
            for n, fn in saved.items():
                setattr(dist, n, fn)
    save_rank(out_dir, rank, runs)


def test_fsdp2_on_two_cpu_ranks_sends_the_predicted_bytes(tmp_path):
    """torch's fully_shard (FSDP2) on 2 gloo ranks, one unit per layer as the simulator
    models it: per iteration it all-gathers every unit in each forward and again in each
    backward and reduce-scatters every unit's gradient in each backward -- the ring bytes
    of those collectives equal ``predict(zero=3)``'s data-parallel bytes exactly under both
    schedules with execute mode's prefetch (fp32; digits-mlp's first dimensions are even,
    so FSDP2 pads no shard; it pads each parameter's first dimension to a multiple of the
    ranks, which the model does not). FSDP2's default backward prefetch, under GPipe's
    order, gathers the last unit once more per step and drops it unused (a mistargeted
    prefetch, perfsim.runtime.fsdp.prefetch_within_micro_batch): an avoidable cost that
    execute mode does not pay and the simulator does not model."""
    from _helpers import run_ranks

    m, mb, n = 2, 2, 2
    ranks = run_ranks(_fsdp_worker, tmp_path, m, mb)
    last = 2570 * 4  # digits-mlp's fc3 in fp32, gathered whole
    predicted = {order: predict(model="digits-mlp", pp=1, dp=n, zero=3, micro_batch=mb, macro_batch=m * mb,
                                precision="fp32", schedule=order).summary["dp_bytes"] for order in ("1f1b", "gpipe")}
    for runs in ranks:
        assert len(runs) == 4
        for (prefetch, order), sent in runs.items():
            kinds = [k for k, _ in sent]
            units = kinds.count("reduce_scatter") // m
            extra = prefetch == "fsdp2-default" and order == "gpipe"
            assert units == 4 and kinds.count("allgather") == 2 * m * units + extra, (prefetch, order)  # fc0..fc3
            wire = sum((n - 1) * b if k == "allgather" else (n - 1) / n * b for k, b in sent)
            assert n * wire == predicted[order] + extra * (n - 1) * last, (prefetch, order)


def test_units_keep_every_layers_compute():
    """A layer without parameters has no collectives; its compute joins a neighbour, so
    the units' shares still sum to the stage's whole forward and backward."""
    from types import SimpleNamespace

    from perfsim.compression import make_compressor
    from perfsim.engine.sharding import shard_units

    layers = [SimpleNamespace(params=p) for p in (0, 10, 0, 20, 0)]
    units = shard_units(layers, [1, 2, 3, 4, 5], [2, 2, 2, 2, 2], make_compressor("fp32"), 2, 3, 2)
    assert [u.params for u in units] == [10, 20]
    assert sum(u.fwd_share for u in units) == pytest.approx(1.0)
    assert sum(u.bwd_share for u in units) == pytest.approx(1.0)
    assert [u.fwd_share for u in units] == pytest.approx([6 / 15, 9 / 15])
    assert [u.gather_bytes for u in units] == [10, 20]
    assert [st.kind for u in units for st in u.rs_steps] == ["reduce_scatter"] * 2


def test_perfsim_run_zero3_measures_the_predicted_bytes(tmp_path):
    """``perfsim run --zero 3`` trains with FSDP2 on 2 gloo CPU ranks and meters its
    collectives: the data-parallel bytes per step equal ``perfsim predict --zero 3``'s;
    what execute mode cannot run is refused in one line."""
    from _helpers import assert_user_error, run_cli, run_cli_here

    out = tmp_path / "run"
    # GPipe, the default of both (1F1B: test_fsdp2_on_two_cpu_ranks_sends_the_predicted_bytes runs
    # execute mode's shard_stage under both orders)
    proc = run_cli("run", "--model", "digits-mlp", "--pp", "1", "--dp", "2", "--zero", "3", "--steps", "3",
                   "--schedule", "gpipe", "--micro-batch", "8", "--macro-batch", "16", "--out", str(out),
                   "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert "zero=3 (FSDP2)" in proc.stdout
    measured = json.loads((out / "result.json").read_text())["summary"]
    predicted = predict(model="digits-mlp", pp=1, dp=2, zero=3, schedule="gpipe", micro_batch=8, macro_batch=16,
                        precision="fp32").summary
    assert measured["zero"] == 3
    assert measured["dp_bytes"] == predicted["dp_bytes"]
    for extra, culprit in ((["--pp", "2"], "pp"), (["--grad-compress", "qsgd-maxnorm:4"], "grad_compress")):
        args = ["run", "--model", "digits-mlp", "--dp", "2", "--zero", "3", "--steps", "1", *extra]
        if "--pp" not in extra:
            args += ["--pp", "1"]
        r = run_cli_here(*args, "--out", str(tmp_path / culprit))
        assert_user_error(r.returncode, r.stderr, culprit)
    r = run_cli_here("run", "--model", "digits-mlp", "--pp", "1", "--dp", "2", "--zero", "2", "--out",
                     str(tmp_path / "z2"))
    assert_user_error(r.returncode, r.stderr, "zero=2")


def test_fp8_and_zero_with_a_mixture_of_experts():
    """fp8 memory counts each MoE block's local experts' GEMM weights (and their scaling
    state, 2 GEMMs per local MLP); ZeRO-2/3 with expert parallelism is refused."""
    from perfsim.api import build_configs
    from perfsim.models.tensor_parallel import block_gemm_params, block_mlp_widths

    mixtral = str(Path(__file__).parents[1] / "data" / "configs" / "mixtral-8x7b.json")
    base = dict(model=mixtral, gpu="h100", tp=8, pp=4, gpus_per_node=8, global_batch=32, seq_len=1024,
                attention="flash")
    spec = build_configs(**base)[0].arch
    w = {p: predict(**base, precision=p).stages[0]["weights_gib"] * GIB for p in ("bf16", "fp8")}
    st = predict(**base, precision="fp8").stages[0]
    first, last = (int(x) for x in st["layers"].split("-"))
    blocks = [i - 1 for i in range(first, last + 1) if 1 <= i <= spec.n_layer]
    copies = 2 * sum(-(-block_gemm_params(spec, i) // 8) for i in blocks)
    state = sum(2 + 2 * len(block_mlp_widths(spec, i)) for i in blocks) * 5 * (1024 + 2) * 4
    assert w["fp8"] - w["bf16"] == pytest.approx(copies + state, rel=1e-9)
    with pytest.raises(ConfigError, match="ep=2"):
        predict(**dict(base, pp=1, dp=2), ep=2, zero=3)


def test_zero3_on_a_cpu_profile_blocks_the_training_thread():
    """With a profile calibrated on a CPU (gloo, no GPU preset) FSDP2's collectives block the
    training thread: the iteration is compute + every unit's gathers and reduce-scatters +
    the step, nothing overlapped; each collective is priced as the profile timed the torch
    call FSDP2 issues, plus FSDP2's copies at the profile's copy cost. A GPU preset beside
    the same profile keeps the overlapped model."""
    from perfsim.analysis.validate import link_params
    from perfsim.api import build_configs
    from perfsim.engine import plan_with_memory
    from perfsim.engine.buckets import copy_time
    from perfsim.engine.sharding import FSDP_CALLS
    from perfsim.profile import load_profile

    path = str(Path(__file__).parents[2] / "traces" / "cpu-2core.json")
    link = link_params(load_profile(path), None, 0.0, "profile", True)[0]  # loopback, as perfsim validate
    kw = dict(model="digits-mlp", pp=1, dp=2, zero=3, micro_batch=8, macro_batch=16, profile=path,
              overlap=False, **link)
    w, s, sy, p = build_configs(**kw)
    net, plan, _ = plan_with_memory(w, s, sy, p, True)
    assert plan.shard_host_driven
    m, units = plan.num_microbatches, plan.stages[0].units
    serial = 0.0
    for u in units:
        whole, shard = 4 * u.params, 2 * u.params
        assert u.gather_host_s == copy_time(p, shard) + copy_time(p, whole) == u.rs_host_s
        ag = net.collective("allgather", u.gather_bytes, [0, 1], lockstep=True, call=FSDP_CALLS["allgather"]).time()
        rs = sum(net.collective(st.kind, st.nbytes, [0, 1], lockstep=True, call=FSDP_CALLS[st.kind]).time()
                 for st in u.rs_steps)
        assert ag != net.collective("allgather", u.gather_bytes, [0, 1]).time()  # the measured call, not the ring
        serial += 2 * m * (u.gather_host_s + ag) + m * (u.rs_host_s + rs)
    r = predict(**kw).summary
    assert r["dp_sync_s"] == pytest.approx(serial, rel=1e-9)
    assert r["iteration_s"] == pytest.approx(r["compute_s"] + r["dp_sync_s"] + r["optimizer_s"], rel=1e-6)
    assert r["dp_bytes"] == predict(**dict(kw, profile=None)).summary["dp_bytes"]  # bytes do not depend on it
    on_gpu = build_configs(**dict(kw, gpu="h100"))
    assert not plan_with_memory(*on_gpu, True)[1].shard_host_driven


def test_zero3_on_a_cpu_profile_adds_fsdp2s_own_host_time_per_unit_and_pass(capsys):
    """A CPU profile with ``fsdp_host`` records (perfsim calibrate --comm fsdp): each unit's
    forward and backward add its per-pass host time on the training thread, the root's once
    per stage pass, all in ``dp_sync_s``; the iteration grows by exactly that, bytes do not
    move, and the summary says what was priced. Without the records: 0, and a note saying so."""
    from perfsim.analysis.validate import link_params
    from perfsim.profile import load_profile

    path = str(Path(__file__).parents[2] / "traces" / "cpu-2core.json")
    link = link_params(load_profile(path), None, 0.0, "profile", True)[0]
    kw = dict(model="digits-mlp", pp=1, dp=2, zero=3, micro_batch=8, macro_batch=16, overlap=False, **link)
    bare = load_profile(path)
    hooked = load_profile(path)
    hook = {"unit_forward": 5e-4, "unit_backward": 7e-4, "root_forward": 1e-4, "root_backward": 2e-4}
    for name, t in hook.items():
        hooked.add(op="fsdp_host", name=name, size_bytes=4224, world_size=2, time_s=t)
    before, after = predict(**kw, profile=bare).summary, predict(**kw, profile=hooked).summary
    n_units, m = 4, 2  # digits-mlp: fc0..fc3, each a unit; 16 / 8 micro-batches
    added = m * (n_units * (hook["unit_forward"] + hook["unit_backward"]) + hook["root_forward"]
                 + hook["root_backward"])
    assert after["dp_sync_s"] - before["dp_sync_s"] == pytest.approx(added, rel=1e-9)
    assert after["iteration_s"] - before["iteration_s"] == pytest.approx(added, rel=1e-9)
    assert after["compute_s"] == before["compute_s"] and after["dp_bytes"] == before["dp_bytes"]
    assert "priced as 0" in before["shard_host_note"] and "--comm fsdp" in before["shard_host_note"]
    assert after["shard_host_note"].startswith("FSDP2's host time from the profile: 500 + 700 us")
    zero0 = predict(**dict(kw, zero=0), profile=hooked).summary  # DDP: no FSDP2, no note
    assert "shard_host_note" not in zero0
    assert predict(**dict(kw, zero=0), profile=bare).summary["iteration_s"] == zero0["iteration_s"]
    assert main(["predict", "--model", "digits-mlp", "--pp", "1", "--dp", "2", "--zero", "3", "--micro-batch",
                 "8", "--macro-batch", "16", "--profile", path]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the table may wrap a long line
    assert "sharding: FSDP2's host time (hooks, unshard / reshard) not in the profile: priced as 0" in out
