"""GPU presets and the per-operator compute model."""

import dataclasses

import pytest

from perfsim.api import build_configs, predict
from perfsim import hardware
from perfsim.engine import compute, curve_fit
from perfsim.errors import ConfigError
from perfsim.hardware import GPUS, get_gpu
from perfsim.models.ops import Op, block_ops
from perfsim.models.transformer import parse_inline

SPEC = parse_inline("gpt:layers=4,hidden=2048,heads=16,seq=1024,vocab=50304")


def test_presets_cover_the_issue_with_sources():
    for name in ("v100-sxm2-16gb", "v100-sxm2-32gb", "a100-sxm4-40gb", "a100-sxm4-80gb", "a100-pcie-40gb",
                 "a100-pcie-80gb", "h100-sxm5-80gb", "h100-pcie-80gb", "h200-sxm-141gb", "l4", "rtx-4090",
                 "mi300x"):
        g = GPUS[name]
        assert g.source.startswith(("NVIDIA", "AMD")) and "http" in g.source
        assert g.memory_bytes > 15e9 and g.memory_bandwidth_Bps >= 300e9
    a100 = get_gpu("A100")
    assert a100.name == "a100-sxm4-80gb" and a100.peak("bf16") == 312e12 and a100.peak("fp32") == 19.5e12
    assert get_gpu("h100").peak("fp16") == pytest.approx(989.4e12)
    with pytest.raises(ConfigError, match="bf16"):
        get_gpu("v100").peak("bf16")
    with pytest.raises(ConfigError, match="gpu 'b200'"):
        get_gpu("b200")


def _block(gpu, precision="bf16", mb=1, tp=1):
    curve, _ = hardware.curve_for(get_gpu(gpu))
    f, b = compute.transformer_times(SPEC, get_gpu(gpu), precision, mb, tp, False, "none", curve)
    return f[1], b[1]


def test_compute_model_monotone():
    times = [_block("a100", mb=m)[0] for m in (1, 2, 4, 8, 16)]
    assert all(x < y for x, y in zip(times, times[1:]))
    # faster GPU, faster precision, more tensor parallelism: less time per rank
    assert _block("h100", mb=8)[0] < _block("a100", mb=8)[0] < _block("v100", "fp16", mb=8)[0]
    assert _block("a100", "bf16", mb=8)[0] < _block("a100", "tf32", mb=8)[0] < _block("a100", "fp32", mb=8)[0]
    assert _block("a100", mb=8, tp=4)[0] < _block("a100", mb=8, tp=2)[0] < _block("a100", mb=8, tp=1)[0]
    # every operator costs at least the host's time to issue it: TP cannot go below that
    curve, _ = hardware.curve_for(get_gpu("a100"))
    assert _block("a100", mb=1, tp=8)[0] >= 13 * curve.kernel_s
    # GEMM efficiency never falls with size: small GEMMs sit on the host floor, large ones reach
    # the curve's eff_max (the fitted A100 knee is 0: the data do not constrain it)
    curve, _ = hardware.curve_for(get_gpu("a100"))
    ach = [Op("g", m=n, n=n, k=n).flops / compute.op_time(Op("g", m=n, n=n, k=n),
                                                                  get_gpu("a100"), "bf16", curve, 2)
           for n in (256, 1024, 4096, 16384)]
    assert all(x <= y for x, y in zip(ach, ach[1:])) and ach[0] < ach[-1] <= 312e12


def test_recompute_costs_a_forward():
    g = get_gpu("a100")
    curve, _ = hardware.curve_for(g)
    f, none = compute.transformer_times(SPEC, g, "bf16", 2, 1, False, "none", curve)
    _, full = compute.transformer_times(SPEC, g, "bf16", 2, 1, False, "full", curve)
    _, sel = compute.transformer_times(SPEC, g, "bf16", 2, 1, False, "selective", curve)
    assert full[1] == pytest.approx(none[1] + f[1])
    assert none[1] < sel[1] < full[1]
    assert full[0] == none[0] and full[-1] == none[-1]  # embed / head are not recomputed


def test_uncalibrated_gpu_states_the_assumption():
    def said(gpu):
        return predict(model="gpt2-xl", gpu=gpu, pp=2, global_batch=8, precision="bf16").summary["compute_model"]

    assert "nearest calibrated" in said("l4") and "l4" in said("l4")
    assert "calibrated on a100" in said("a100")
    assert "calibrated on h200-sxm-141gb (same architecture) applied to h100-pcie-80gb" in said("h100-pcie")
    assert said("h100").endswith("calibrated on h100-sxm5-80gb")  # its own curve
    assert "nearest" not in said("h200")


def _efficiency_profile(gpu, curve, precision="bf16"):
    """A profile whose efficiency records are op_time under ``curve`` (no host floor)."""
    from perfsim.profile import Profile

    p = Profile.default()
    p.records = []
    kernel = dataclasses.replace(curve, kernel_s=0.0)
    for m, n, k in [(s, s, s) for s in (256, 512, 1024, 4096, 8192)] + [(2048, 3 * h, h) for h in (768, 4096)]:
        t = compute.op_time(Op("gemm", m=m, n=n, k=k), gpu, precision, kernel, 2)
        p.add(op="gemm", name=f"{m}x{n}x{k}", dtype="bfloat16", flops=2.0 * m * n * k,
              size_bytes=2 * (m * k + k * n + m * n), time_s=t)
    for m, n, k in ((8192, 50257, 1600), (8192, 1600, 50257)):  # an unpadded LM head's GEMMs
        t = compute.op_time(Op("gemm", m=m, n=n, k=k), gpu, precision, kernel, 2)
        p.add(op="gemm", name=f"{m}x{n}x{k}", dtype="bfloat16", flops=2.0 * m * n * k,
              size_bytes=2 * (m * k + k * n + m * n), time_s=t)
    for s, d in ((512, 64), (1024, 64), (4096, 64), (512, 128), (2048, 128), (4096, 128)):
        op = Op("attention", m=s, n=s, k=d, batch=8192 // s * 16, flash=True)
        tf = compute.flash_time(op, gpu, precision, kernel)
        tb = compute.flash_time(op, gpu, precision, kernel, backward=True)
        name = f"b{8192 // s}h16s{s}d{d}"
        p.add(op="attention", name=f"{name}:fwd", dtype="bfloat16", flops=op.flops, size_bytes=1, time_s=tf)
        p.add(op="attention", name=f"{name}:fwdbwd", dtype="bfloat16", flops=3.5 * op.flops, size_bytes=1,
              time_s=tf + tb)
    for n in (2**20, 2**24, 2**26, 2**28):
        p.add(op="elementwise", name=f"gelu:{n}", dtype="bfloat16", flops=0.0, size_bytes=4 * n,
              time_s=compute.op_time(Op("gelu", bytes=4 * n), gpu, precision, kernel, 2))
    return p


def test_fit_curve_recovers_the_curve_behind_efficiency_records():
    g = get_gpu("h200")
    truth = hardware.Curve(eff_max=0.62, knee=96.0, mem_eff=0.7, kernel_s=0.0, source="truth", misaligned_eff=0.3,
                          flash_eff=0.5, flash_knee_s=512.0, flash_knee_d=96.0, flash_bwd_eff=0.4,
                          flash_bwd_knee_s=1024.0, flash_bwd_knee_d=48.0)
    host = hardware.A100_CURVE
    fit = curve_fit.fit_curve(_efficiency_profile(g, truth), g, "bf16", host, "test", min_time_s=0.0)
    assert fit.eff_max == pytest.approx(0.62, rel=0.02) and fit.knee == pytest.approx(96, abs=8)
    assert fit.mem_eff == pytest.approx(0.7, rel=1e-3)
    assert fit.misaligned_eff == pytest.approx(0.3, rel=0.03)  # fitted on the misaligned records alone
    assert (fit.flash_eff, fit.flash_knee_s, fit.flash_knee_d) == pytest.approx((0.5, 512, 96), rel=0.02)
    assert (fit.flash_bwd_eff, fit.flash_bwd_knee_s, fit.flash_bwd_knee_d) == pytest.approx((0.4, 1024, 48),
                                                                                            rel=0.02)
    assert (fit.kernel_s, fit.p2p_s, fit.collective_s) == (host.kernel_s, host.p2p_s, host.collective_s)
    # records shorter than min_time_s (launch-bound) are left out; none left is an error
    with pytest.raises(ConfigError, match="bf16 GEMM and memory-bound efficiency records"):
        curve_fit.fit_curve(_efficiency_profile(g, truth), g, "bf16", host, "test", min_time_s=1.0)


def test_every_layer_costs_something_and_head_on_last_stage(tmp_path):
    # the embedded default's profile records embed/head as 0 s, marked folded (priced at 0 s,
    # the paper's equal stages); without that fact a 0 s record is no measurement: the layers
    # are derived from FLOPs and bytes at the profile's own rates instead
    import json

    from perfsim.profile.format import default_profile_path

    assert build_configs()[0].fwd_s[-1] == 0.0
    data = json.loads(default_profile_path().read_text())
    for r in data["records"]:
        r.pop("folded", None)
    unfolded = tmp_path / "unfolded.json"
    unfolded.write_text(json.dumps(data))
    w, _, _, prof = build_configs(profile=str(unfolded))
    rate, bw = prof.effective_flops(), prof.metadata["memory_bandwidth_Bps"]
    # LM head: 1600 x 50257 GEMM per token, 1024 tokens; bytes: final norm, GEMM operands, fp32 loss
    # (Megatron's cross entropy on fp32 logits: max, subtract, exp, sum, divide = 4+8+8+4+8 bytes each)
    moved = 4 * (2 * 1024 * 1600 + 1024 * 1600 + 1600 * 50257 + 1024 * 50257) + 32 * 1024 * 50257
    assert w.fwd_s[-1] == pytest.approx(2 * 1024 * 1600 * 50257 / rate + moved / bw)
    assert w.fwd_s[-1] > 2 * w.fwd_s[1] and w.fwd_s[0] > 0 and w.bwd_s[-1] == 2 * w.fwd_s[-1]
    r = predict(partition="7,6,6,6,6,6,6,7", profile=str(unfolded))
    assert r.stages[-1]["fwd_s_per_mb"] == pytest.approx(sum(w.fwd_s[-7:]))
    g = predict(model="gpt2-xl", gpu="a100", pp=4, global_batch=8, precision="bf16", partition="13,12,12,13")
    assert g.stages[-1]["fwd_s_per_mb"] > g.stages[1]["fwd_s_per_mb"]  # 12 blocks + head vs 12 blocks


def test_layer_without_time_or_flops_is_an_error(tmp_path):
    wl = tmp_path / "w.toml"
    wl.write_text('name = "x"\n[[layers]]\nname = "a"\nparams = 10\nout_shape = [4]\nflops = 100\n'
                  '[[layers]]\nname = "b"\nparams = 10\nout_shape = [4]\n')
    with pytest.raises(ConfigError, match=r"\('b'\) has neither fwd_s nor flops"):
        predict(workload=str(wl), pp=1)


def test_precision_follows_tensor_cores_on_the_default_profile():
    # the default V100 profile's records are fp32; fp16 uses the V100's tensor cores
    fp32 = predict(model="bert-large", pp=1, macro_batch=32, micro_batch=32)
    fp16 = predict(model="bert-large", pp=1, macro_batch=32, micro_batch=32, precision="fp16")
    assert fp16.summary["iteration_s"] < fp32.summary["iteration_s"] / 2
    assert "v100" in fp16.summary["compute_model"]


def test_curve_validation():
    with pytest.raises(ConfigError):
        dataclasses.replace(hardware.A100_CURVE, eff_max=1.5)


def test_recompute_on_measured_profile_times():
    base = dict(model="gpt2-xl", pp=8, macro_batch=8)
    none, full = predict(**base, recompute="none"), predict(**base, recompute="full")
    sel = predict(**base, recompute="selective")
    st_n, st_f, st_s = none.stages[3], full.stages[3], sel.stages[3]
    assert st_f["bwd_s_per_mb"] == pytest.approx(st_n["bwd_s_per_mb"] + st_n["fwd_s_per_mb"])
    # gpt2-xl at 1024 tokens: attention core 4 T^2 d of 2 x 12 d^2 T + 4 T^2 d FLOPs per sample
    share = 4 * 1024 / (24 * 1600 + 4 * 1024)
    assert st_s["bwd_s_per_mb"] == pytest.approx(st_n["bwd_s_per_mb"] + share * st_n["fwd_s_per_mb"])


def test_measured_operator_rates_win(tmp_path):
    """A profile with calibrate --efficiency records prices GEMMs and memory-bound ops
    at the measured rates instead of the curve (on its own GPU: the A100 named)."""
    from perfsim.profile import Profile

    prof = Profile.default()
    recs = [dict(op="gemm", name=f"{n}x{n}x{n}", dtype="bfloat16", flops=2.0 * n**3,
                 size_bytes=6 * n * n, time_s=2.0 * n**3 / 100e12) for n in (512, 2048, 8192)]
    recs += [dict(op="elementwise", name=f"gelu:{n}", dtype="bfloat16", flops=8.0 * n, size_bytes=4 * n,
                  time_s=4 * n / 1e12) for n in (2**16, 2**20, 2**26)]
    data = prof.to_dict()
    data["records"] = data["records"] + recs
    data["metadata"] = dict(data["metadata"], device_name="NVIDIA A100-SXM4-80GB")  # the A100's records
    p = tmp_path / "eff.json"
    Profile.from_dict(data).save(p)
    base = dict(model="gpt:layers=4,hidden=4096,heads=32,seq=2048,vocab=32000", gpu="a100", pp=1,
                micro_batch=4, global_batch=4, precision="bf16")
    measured = predict(**base, profile=str(p))
    curve = predict(**base)
    assert "measured in the profile" in measured.summary["compute_model"]
    # 100 TFLOP/s measured against the curve's ~0.83 x 312: slower
    assert measured.stages[0]["fwd_s_per_mb"] > 1.8 * curve.stages[0]["fwd_s_per_mb"]


GPU_GPT = dict(model="gpt:layers=8,hidden=1024,heads=16,seq=1024,vocab=50304", gpu="a100", micro_batch=1,
               global_batch=8, precision="fp16")


def test_contiguous_grad_buffer_drops_the_bucket_copies():
    # PyTorch DDP copies every bucket in and out (read + write, 4 bytes a gradient, twice);
    # Megatron's contiguous buffer is reduced in place. Both copies run at the GPU's rate.
    base = dict(GPU_GPT, pp=1, dp=2, overlap=False, gpus_per_node=2)
    bucketed = predict(**base, grad_buffer="bucketed")
    contiguous = predict(**base)  # a gpu preset follows Megatron-LM
    assert predict(**base, grad_buffer="contiguous").summary == contiguous.summary
    g = get_gpu("a100")
    copies = 2 * 2 * 4 * bucketed.summary["params"] / (g.memory_bandwidth_Bps * hardware.A100_CURVE.mem_eff)
    saved = bucketed.summary["dp_sync_s"] - contiguous.summary["dp_sync_s"]
    assert saved == pytest.approx(copies, rel=1e-6)
    assert contiguous.summary["iteration_s"] == pytest.approx(bucketed.summary["iteration_s"] - copies, rel=1e-6)
    with pytest.raises(ConfigError, match="grad_buffer='flat'"):
        predict(**base, grad_buffer="flat")


def test_pipeline_messages_pay_the_gpus_host_round_trip(monkeypatch):
    # every pipeline send and receive on a GPU costs the curve's p2p_s (Megatron synchronises
    # the device after each exchange): 2 per micro-batch per boundary on each side
    base = dict(GPU_GPT, pp=2, dp=1, schedule="1f1b")
    host = 1e-3
    monkeypatch.setitem(hardware.GPUS, "a100-sxm4-80gb", dataclasses.replace(hardware.GPUS["a100-sxm4-80gb"], curve=dataclasses.replace(hardware.A100_CURVE, p2p_s=0.0)))
    free = predict(**base)
    monkeypatch.setitem(hardware.GPUS, "a100-sxm4-80gb", dataclasses.replace(hardware.GPUS["a100-sxm4-80gb"], curve=dataclasses.replace(hardware.A100_CURVE, p2p_s=host)))
    paid = predict(**base)
    nmb = 8
    assert paid.summary["encode_s"] - free.summary["encode_s"] == pytest.approx(2 * nmb * host)
    extra = paid.summary["iteration_s"] - free.summary["iteration_s"]
    assert 2 * nmb * host <= extra + 1e-9 and extra <= 4 * nmb * host + 1e-9
    with pytest.raises(ConfigError, match="p2p_s"):
        dataclasses.replace(hardware.A100_CURVE, p2p_s=-1.0)


def test_gpu_preset_reduces_gradients_after_the_backward_as_megatron_does():
    base = dict(GPU_GPT, pp=2, dp=4, tp=2, gpus_per_node=8, bandwidth="200Gbps", global_batch=64)
    default, after, overlapped = predict(**base), predict(**base, overlap=False), predict(**base, overlap=True)
    assert default.summary["iteration_s"] == after.summary["iteration_s"]
    assert overlapped.summary["iteration_s"] < after.summary["iteration_s"]
    # without a gpu preset the PyTorch DDP default stays: overlap on
    cpu = dict(model="gpt2", pp=2, dp=2)
    assert predict(**cpu).summary["iteration_s"] == predict(**cpu, overlap=True).summary["iteration_s"]


@pytest.mark.parametrize("stored, gpu, path", [
    (hardware.H200_CURVE, "h200", "gpu-h200.json"),
    (hardware.H100_CURVE, "h100", "gpu/h100-efficiency-2026-11-26.json")])
def test_gpu_curves_are_the_fits_of_the_stored_profiles(stored, gpu, path):
    from pathlib import Path

    from perfsim.profile import load_profile

    path = Path(__file__).resolve().parents[2] / "traces" / path
    fit = curve_fit.fit_curve(load_profile(path), get_gpu(gpu), "bf16", hardware.A100_CURVE, "")
    assert dataclasses.replace(fit, source=stored.source) == stored  # host side: the A100 fit's in both


def test_a_gpu_profile_names_its_gpu_and_its_measured_layers_win():
    from pathlib import Path

    path = str(Path(__file__).resolve().parents[2] / "traces" / "gpu-h200.json")

    def said(model):
        return predict(model=model, profile=path, pp=1, micro_batch=8, global_batch=8,
                       precision="bf16").summary["compute_model"]

    # no --gpu: the profile's device_name (NVIDIA H200) is the GPU; gpt2-medium is measured per layer
    assert said("gpt2-medium") == "profile's per-layer records"
    # a model it did not time: the operator model on the profile's measured rates
    assert said("gpt2-xl").startswith("operator rates measured in the profile")


def test_a_misaligned_feature_dimension_slows_a_gemm_and_megatron_pads_the_vocabulary():
    from perfsim.engine.layer_times import resolve_layer_times
    from perfsim.workload import get_model

    assert compute.misaligned(Op("h", m=8192, n=50257, k=1600), 2)
    assert compute.misaligned(Op("h", m=8192, n=1600, k=50257), 2)
    assert not compute.misaligned(Op("h", m=50257, n=1600, k=8192), 2)  # tokens: never a leading dim
    assert not compute.misaligned(Op("h", m=8, n=50304, k=1600), 2)
    assert compute.misaligned(Op("h", m=8, n=1602, k=1600), 4) and \
        not compute.misaligned(Op("h", m=8, n=1604, k=1600), 4)  # fp32: 4 values = 16 bytes
    g = get_gpu("h100")
    curve = hardware.H200_CURVE
    assert curve.misaligned_eff < 1
    big = dict(m=8192, k=4096)
    aligned = compute.op_time(Op("h", n=50304, **big), g, "bf16", curve, 2)
    slow = compute.op_time(Op("h", n=50296 + 1, **big), g, "bf16", curve, 2)
    assert slow / aligned == pytest.approx(50297 / 50304 / curve.misaligned_eff, rel=1e-6)
    # GPT-2's 50257 tokens: unpadded (as execute mode and Hugging Face train) the LM head is
    # slow; Megatron's padding to 128 x tp makes it aligned (and a hair larger)
    model = get_model("gpt2-xl")
    pad = resolve_layer_times(model, None, 8, gpu=g, precision="bf16", vocab_multiple=128)
    raw = resolve_layer_times(model, None, 8, gpu=g, precision="bf16")
    assert raw[0][-1] > 1.5 * pad[0][-1] and raw[0][1] == pad[0][1]
    # --gpu switches the Megatron defaults on, padding included
    head = predict(model="gpt2-xl", gpu="h100", pp=1, micro_batch=8, global_batch=8, precision="bf16",
                   recompute="full")
    assert head.stages[0]["compute_s"] == pytest.approx(
        predict(model="gpt:layers=48,hidden=1600,heads=25,seq=1024,vocab=50304", gpu="h100", pp=1,
                micro_batch=8, global_batch=8, precision="bf16", recompute="full").stages[0]["compute_s"],
        rel=1e-9)


def test_flash_attention_is_one_kernel_and_stores_no_scores():
    from perfsim.memory import layer_activation_bytes

    spec = parse_inline("gpt:layers=2,hidden=4096,heads=32,seq=4096,vocab=32000")
    meg = block_ops(spec, 2, 2, False, 2)
    fl = block_ops(spec, 2, 2, False, 2, attention="flash")
    [core] = [op for op in fl if op.attention_core]
    assert core.flash and (core.m, core.n, core.k, core.batch) == (4096, 4096, 128, 2 * 16)
    # FlashAttention's count: 4 b h s^2 d, halved by the causal mask (Megatron's two GEMMs
    # compute the whole score matrix)
    assert core.flops == sum(op.flops for op in meg if op.m and op.attention_core) / 2 == \
        2 * 4096 * 4096 * 128 * 32
    assert [op.name for op in meg if not op.attention_core] == [op.name for op in fl if not op.attention_core]
    g, curve = get_gpu("h100"), hardware.H200_CURVE
    f, b = compute.flash_time(core, g, "bf16", curve), compute.flash_time(core, g, "bf16", curve, backward=True)
    # at the reference shape the rate is peak x eff; the backward does 2.5x the FLOPs
    assert f == pytest.approx(core.flops / (g.peak("bf16") * curve.flash_eff))
    assert b == pytest.approx(2.5 * core.flops / (g.peak("bf16") * curve.flash_bwd_eff))
    mf, bf = compute.transformer_times(spec, g, "bf16", 2, 2, False, "none", curve)
    ff, fb = compute.transformer_times(spec, g, "bf16", 2, 2, False, "none", curve, attention="flash")
    assert ff[1] < mf[1] and fb[1] < bf[1] and ff[0] == mf[0] and ff[-1] == mf[-1]
    # no s x s tensor kept: only an fp32 log-sum-exp per query and head
    none = layer_activation_bytes(spec, 2, 2, False, "none", 2)
    flash = layer_activation_bytes(spec, 2, 2, False, "none", 2, attention="flash")
    assert none - flash == 5 * 32 * 4096 * 4096 * 2 / 2 - 4 * 32 * 4096 * 2 / 2
    with pytest.raises(ConfigError, match="attention=flash: the efficiency curve"):
        compute.flash_time(core, g, "bf16", hardware.Curve(0.8, 0.0, 0.8, 0.0, "no flash fit"))


def test_flash_attention_from_the_api_and_a_profile():
    from pathlib import Path

    kw = dict(model="llama2-7b", gpu="h100", tp=2, pp=2, micro_batch=1, global_batch=8, precision="bf16")
    meg, fl = predict(**kw, attention="megatron"), predict(**kw, attention="flash")
    assert (meg.summary["attention"], fl.summary["attention"]) == ("megatron", "flash")
    assert fl.summary["iteration_s"] < meg.summary["iteration_s"]
    assert fl.summary["peak_memory_gib"] < meg.summary["peak_memory_gib"]
    with pytest.raises(ConfigError, match="attention='bogus'"):
        predict(**kw, attention="bogus")
    # a profile with fused-attention records prices it at their measured rates
    path = str(Path(__file__).resolve().parents[2] / "traces" / "gpu-h200.json")
    r = predict(model="gpt2-xl", profile=path, gpu="h200", pp=1, micro_batch=4, global_batch=4,
                precision="bf16", attention="flash")
    assert r.summary["compute_model"].startswith("operator rates measured in the profile")


@pytest.mark.parametrize("gpu, precision, expected", [
    ("h100", "bf16", "flash"), ("a100", "fp16", "flash"), ("h100", "fp8", "flash"), ("mi300x", "bf16", "flash"),
    ("l4", "bf16", "flash"), ("v100", "fp16", "megatron"), ("a100", "fp32", "megatron"), ("h100", "tf32", "megatron"),
    (None, "fp32", "megatron")])
def test_attention_defaults_to_flash_where_flash_attention_runs(gpu, precision, expected):
    """Unless told, a transformer's attention is FlashAttention-2 on the GPUs and precisions it runs
    on (hardware.default_attention), and the default is the same job as asking for it by name."""
    kw = dict(model="gpt:layers=2,hidden=256,heads=4,seq=2048,vocab=1000", pp=1, micro_batch=1, global_batch=1,
              precision=precision, allow_oom=True)
    if gpu:
        kw["gpu"] = gpu
    default = predict(**kw).summary
    named = predict(**kw, attention=expected).summary
    assert default["attention"] == expected
    assert (default["iteration_s"], default["peak_memory_gib"]) == (named["iteration_s"], named["peak_memory_gib"])


def test_heads_wider_than_flash_attention_takes_default_to_the_unfused_kernels():
    kw = dict(gpu="h100", pp=1, micro_batch=1, global_batch=1, precision="bf16", allow_oom=True)
    at = {heads: predict(model=f"gpt:layers=2,hidden=2048,heads={heads},seq=1024,vocab=1000", **kw).summary["attention"]
          for heads in (8, 4)}  # head dimensions 256 and 512
    assert at == {8: "flash", 4: "megatron"}


def test_lm_head_eff_slows_the_vocabulary_gemm_and_nothing_else():
    from perfsim.workload import get_model

    spec = get_model("gpt:layers=2,hidden=1024,heads=16,seq=1024,vocab=50304").arch
    g = get_gpu("a100-sxm4-80gb")
    fast = dataclasses.replace(hardware.A100_CURVE, lm_head_eff=1.0)
    slow = dataclasses.replace(fast, lm_head_eff=0.25)

    def times(curve):
        return compute.transformer_times(spec, g, "fp16", 2, 1, False, "full", curve)

    (f1, b1), (f2, b2) = times(fast), times(slow)
    assert f1[:-1] == f2[:-1] and b1[:-1] == b2[:-1]  # embedding and blocks untouched
    head = Op("lm_head", m=2048, n=50304, k=1024, lm_head=True)
    gemm = compute.op_time(head, g, "fp16", fast, 2)
    assert f2[-1] - f1[-1] == pytest.approx(3 * gemm)  # the head's GEMM at a quarter of the rate
    assert b2[-1] - b1[-1] == pytest.approx(6 * gemm)  # and its two backward GEMMs
    with pytest.raises(ConfigError, match="lm_head_eff"):
        dataclasses.replace(fast, lm_head_eff=0.0)


def test_measured_curves_run_the_lm_head_at_the_blocks_rate():
    """Hopper's curves keep lm_head_eff 1 because an H200 measured it so: its padded LM-head
    GEMM records (vocabulary 50304, every orientation) reach the rate of the block GEMMs'."""
    import json
    import statistics
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "traces" / "gpu-h200.json"
    recs = [r for r in json.loads(path.read_text())["records"]
            if r["op"] == "gemm" and r["dtype"] == "bfloat16" and r["flops"] > 5e10]
    rate = {True: [], False: []}
    for r in recs:
        if "50257" not in r["name"]:  # the unpadded head is the misaligned case
            rate["50304" in r["name"]].append(r["flops"] / r["time_s"])
    assert len(rate[True]) >= 6 and len(rate[False]) >= 20
    assert statistics.median(rate[True]) / statistics.median(rate[False]) > 0.9
    assert hardware.H200_CURVE.lm_head_eff == 1.0 == hardware.H100_CURVE.lm_head_eff
    assert hardware.A100_CURVE.lm_head_eff < 1.0  # the A100 runs' fit (scripts/calibrate_a100.py)


def test_host_overhead_replaces_the_curves_host_time_per_operator():
    kw = dict(model="gpt:layers=4,hidden=1024,heads=16,seq=1024,vocab=50304", gpu="h200", pp=1,
              micro_batch=1, global_batch=1, precision="bf16")
    default = predict(**kw)
    same = predict(**kw, host_overhead=hardware.H200_CURVE.kernel_s)
    assert same.summary["iteration_s"] == pytest.approx(default.summary["iteration_s"], rel=1e-12)
    fast = predict(**kw, host_overhead="10us")
    assert fast.summary["iteration_s"] < 0.6 * default.summary["iteration_s"]  # one sequence: host-bound
    assert fast.summary["compute_model"].endswith("host time per operator 10 us (given)")
    big = dict(kw, micro_batch=16, global_batch=16)  # GPU-bound: the host floor hardly matters
    assert predict(**big, host_overhead="10us").summary["iteration_s"] == pytest.approx(
        predict(**big).summary["iteration_s"], rel=0.1)
    with pytest.raises(ConfigError, match="host_overhead"):
        predict(model="gpt2-tiny", pp=2, host_overhead="25us")  # a CPU profile's times are measured


def test_host_overhead_of_eager_pytorch_fits_the_h200_steps():
    """docs/gpu.md: the H200 step benchmark (execute mode's GPT with Megatron's attention, eager
    PyTorch) is host-bound at one to four sequences; at the A100 Megatron host's 58 us per operator
    the model is up to 2x slow there, at 25 us within 20 % on every row."""
    import csv
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "traces" / "gpu" / "h200-steps-megatron-2026-11-26.csv"
    rows = [r for r in csv.DictReader(path.open()) if r["attention"] == "megatron"]
    assert len(rows) == 10

    def worst(**extra):
        errs = []
        for r in rows:
            mb = int(r["micro_batch"])
            p = predict(model=f"gpt:layers={r['layers']},hidden={r['hidden']},heads={r['heads']},"
                              f"seq={r['seq']},vocab={r['vocab']}", gpu="h200", pp=1, micro_batch=mb,
                        global_batch=mb, precision="bf16", recompute="none", attention="megatron", allow_oom=True,
                        **extra)
            errs.append(abs(p.summary["iteration_s"] / float(r["step_s"]) - 1))
        return max(errs)

    assert worst() > 0.5
    assert worst(host_overhead="25us") < 0.2


def test_a_named_gpu_is_not_priced_with_another_devices_records():
    """qa3: with the default profile (per-layer records of gpt2-xl timed on a V100),
    `--gpu a100` and `--gpu h100` both priced compute from the V100's records (7.69 s an
    iteration each, compute_model "profile's per-layer records"), as did a CPU profile's
    records for `--gpu a100`. The records (and measured operator rates) describe the
    profile's device: they price its own GPU (or one of the same silicon), never another."""
    from pathlib import Path

    kw = dict(model="gpt2-xl", pp=8, bandwidth="10Gbps", allow_oom=True)
    a100, h100, v100 = (predict(**kw, gpu=g).summary for g in ("a100", "h100", "v100"))
    assert v100["compute_model"].startswith("profile's per-layer records (")  # the V100 profile's own GPU (32 GB twin)
    for s, name in ((a100, "a100-sxm4-80gb"), (h100, "h100-sxm5-80gb")):
        assert "per-layer records" not in s["compute_model"] and name in s["compute_model"], s["compute_model"]
    assert h100["compute_s"] < a100["compute_s"] < v100["compute_s"]
    cpu = predict(model="gpt2-tiny", pp=2, profile="cpu-2core", gpu="a100").summary
    assert "per-layer records" not in cpu["compute_model"]
    assert cpu["compute_s"] == pytest.approx(predict(model="gpt2-tiny", pp=2, gpu="a100").summary["compute_s"])
    path = str(Path(__file__).resolve().parents[2] / "traces" / "gpu-h200.json")  # an H200's operator rates
    other = predict(model="gpt2-xl", profile=path, gpu="a100", pp=1, micro_batch=4, global_batch=4,
                    precision="bf16").summary["compute_model"]
    assert "measured in the profile" not in other, other


def test_optimizer_streams_at_its_own_rate_when_the_curve_has_one():
    gpu = get_gpu("a100")
    plain = dataclasses.replace(gpu.curve, optimizer_eff=0.0)
    own = dataclasses.replace(gpu.curve, optimizer_eff=2 * plain.mem_eff if plain.mem_eff <= 0.5 else 0.9)
    params = 10**9
    at_mem = compute.optimizer_time(params, gpu, "bf16", plain) - 4 * plain.kernel_s
    at_own = compute.optimizer_time(params, gpu, "bf16", own) - 4 * own.kernel_s
    # 36 bytes per parameter of mixed-precision Adam, at mem_eff when unset, else at optimizer_eff
    assert at_mem == pytest.approx(36 * params / (gpu.memory_bandwidth_Bps * plain.mem_eff))
    assert at_own == pytest.approx(at_mem * plain.mem_eff / own.optimizer_eff)


def test_an_unset_optimizer_rate_is_not_a_bound_violation_but_a_bad_one_is():
    from perfsim.engine.curve_bounds import violations

    curve = hardware.A100_CURVE
    assert not any("optimizer_eff" in v for v in violations(dataclasses.replace(curve, optimizer_eff=0.0)))
    assert any("optimizer_eff" in v for v in violations(dataclasses.replace(curve, optimizer_eff=0.99)))
    with pytest.raises(ConfigError):
        dataclasses.replace(curve, optimizer_eff=1.5)
