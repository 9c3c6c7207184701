"""A compressor's encode/decode cost: a profile's records on its own device, the GPU's model elsewhere
(perfsim.engine.codec_cost)."""

from pathlib import Path

import pytest

from perfsim.api import build_configs, predict
from perfsim.compression import make_compressor
from perfsim.engine.buckets import codec_passes
from perfsim.engine.codec_cost import ModelledCodecs, codec_costs
from perfsim.engine.plan import build_plan
from perfsim.hardware import curve_for, get_gpu
from perfsim.kernels.packing import packed_nbytes
from perfsim.network import Network
from perfsim.profile import load_profile

ROOT = Path(__file__).resolve().parents[2]
CPU = str(ROOT / "traces" / "cpu-2core.json")
H200 = str(ROOT / "traces" / "gpu-h200.json")
JOB = dict(model="gpt2-tiny", pp=2, micro_batch=2, global_batch=8, bandwidth="1Gbps", compress="aqsgd:fw3bw6")


def _plan(**kw):
    workload, strategy, system, profile = build_configs(**kw)
    gpu = get_gpu(system.gpu) if system.gpu else None
    return build_plan(workload, strategy, profile, Network(system, strategy.devices, profile), gpu,
                      system.host_overhead_s), strategy, profile, gpu


def test_cpu_profile_codec_times_do_not_price_an_h100():
    """The CPU's codec records priced the H100's boundaries (encode 0.031 s an iteration on the
    README's pipeline); now each boundary's codec is AQ-SGD's kernels on the H100's model, and the
    same profile without --gpu keeps its records."""
    plan, strategy, profile, gpu = _plan(**JOB, profile=CPU, gpu="h100")
    st = plan.stages[0]
    shape = (2, *st.out_shape[1:])
    nbytes = 4 * 2 * st.out_shape[1] * st.out_shape[2]
    p2p = curve_for(gpu)[0].p2p_s
    model = ModelledCodecs(gpu)
    assert st.fw_encode_s == pytest.approx(model.encode_time("aqsgd:3", nbytes, shape) + p2p)
    assert st.bw_decode_s == pytest.approx(model.decode_time("directq:6", nbytes, shape) + p2p)
    cpu = profile.encode_time("aqsgd:3", nbytes, shape, "gpt2-tiny")
    assert abs(st.fw_encode_s - p2p - cpu) > 0.5 * cpu  # the CPU's time is gone
    assert plan.codec_model.startswith("codec: modelled on h100-sxm5-80gb")
    summary = predict(**JOB, profile=CPU, gpu="h100").summary
    assert summary["codec_model"] == plan.codec_model
    # the CPU profile on its own device: its records, in situ points included
    own, _, _, _ = _plan(**JOB, profile=CPU)
    assert own.stages[0].fw_encode_s == pytest.approx(cpu + profile.framing_time("send", own.stages[0].fw_bytes))
    assert own.codec_model.startswith("codec: the profile's records (AMD EPYC")


def test_same_silicon_profile_keeps_its_measured_codec():
    """An H200 profile predicting an H200 prices codecs from its own records; asked for an H100,
    from the H100's model."""
    prof = load_profile(H200)
    same, how = codec_costs(prof, get_gpu("h200"))
    assert same is prof and how == "codec: the profile's records (NVIDIA H200)"
    other, how = codec_costs(prof, get_gpu("h100"))
    assert isinstance(other, ModelledCodecs) and other.gpu.name == "h100-sxm5-80gb"
    assert "modelled on h100-sxm5-80gb" in how
    plan, _, _, gpu = _plan(**JOB, profile=H200, gpu="h200")
    st = plan.stages[0]
    shape = (2, *st.out_shape[1:])
    nbytes = 4 * 2 * st.out_shape[1] * st.out_shape[2]
    assert st.fw_encode_s == pytest.approx(prof.encode_time("aqsgd:3", nbytes, shape) + curve_for(gpu)[0].p2p_s)


def test_modelled_cost_scales_with_tensor_bytes():
    """Above the host floor (one kernel_s per kernel) the modelled time is the bytes over the
    achieved bandwidth: doubling the tensor doubles it; tiny tensors cost the floor per kernel."""
    model = ModelledCodecs(get_gpu("h100"))
    curve = model.curve
    big = [model.encode_time("directq:4", n) for n in (1 << 30, 1 << 31)]
    assert big[1] / big[0] == pytest.approx(2.0, rel=1e-3)
    n = 1 << 28  # values
    wire = packed_nbytes(n, 4) + 4 * (n // 1024)
    assert model.encode_time("directq:4", 4 * n, (n // 1024, 1024)) == pytest.approx(
        (4 * n + wire) / (model.gpu.memory_bandwidth_Bps * curve.mem_eff))
    assert model.encode_time("directq:4", 4096) == pytest.approx(curve.kernel_s)  # one fused kernel
    assert model.encode_time("qsgd:4", 4096) == pytest.approx(9 * curve.kernel_s)  # nine torch passes
    assert model.encode_time("fp32", 1 << 30) == 0.0  # sent as it is
    # a faster memory system: less time for the same bytes
    assert ModelledCodecs(get_gpu("h200")).encode_time("aqsgd:3", 1 << 31, (8, 1 << 26)) < \
        model.encode_time("aqsgd:3", 1 << 31, (8, 1 << 26))


def test_codec_traffic_counts_the_kernels_bytes():
    """The passes follow the kernels: one fused pass in and out (4 n + payload, as
    benchmarks/bench_kernels.py counts), AQ-SGD's step 12 n + payload, 1-bit Adam's two error-feedback
    passes, PowerSGD's GEMMs (work 2 n m r each)."""
    shape, n = (64, 1024), 64 * 1024
    dq = make_compressor("directq:4")
    enc, dec = dq.codec_traffic(shape)
    assert [p.nbytes for p in enc] == [4 * n + dq.wire_bytes(shape)] == [p.nbytes for p in dec]
    aq = make_compressor("aqsgd:3")
    enc, dec = aq.codec_traffic(shape)
    assert [p.nbytes for p in enc] == [12 * n + aq.wire_bytes(shape)]
    assert [p.nbytes for p in dec] == [aq.wire_bytes(shape) + 8 * n, 8 * n]
    ob = make_compressor("onebit")
    assert [p.nbytes for p in ob.codec_traffic(shape)[0]] == [8 * n, 12 * n + ob.wire_bytes(shape)]
    enc, dec = make_compressor("powersgd:4").codec_traffic((1024, 512))
    assert [p.gemm for p in enc if p.gemm] == [(1024, 4, 512), (512, 4, 1024)]
    assert [p.gemm for p in dec if p.gemm] == [(1024, 512, 4)]
    assert make_compressor("powersgd:4").codec_traffic((3,)) == ((), ())  # too small to compress
    rk = make_compressor("randk-maxnorm:0.1:4")  # the selection, then the inner quantizer on K values
    enc, dec = rk.codec_traffic((n,))
    k = rk.k_of(n)
    assert enc[2:] == rk.inner.codec_traffic((k,))[0] and dec[:-2] == rk.inner.codec_traffic((k,))[1]
    assert [p.nbytes for p in enc[:2]] == [4 * n, 12 * k]


@pytest.mark.parametrize("grad", ["qsgd-maxnorm:4", "onebit-adam", "powersgd:2", "ecq:2"])
def test_gradient_buckets_price_the_codec_on_the_gpu(grad):
    """Gradient compressors on an H100 from a CPU profile: every bucket's encode and decode is
    codec_passes x the modelled compress / decompress of the whole bucket (1-bit Adam: its one
    fused buffer)."""
    kw = dict(model="gpt2-tiny", pp=1, dp=2, micro_batch=2, global_batch=8, bandwidth="1Gbps",
              grad_compress=grad, profile=CPU, gpu="h100")
    plan, strategy, _, gpu = _plan(**kw)
    model = ModelledCodecs(gpu)
    spec = make_compressor(strategy.grad_compress).spec
    buckets = plan.stages[0].buckets
    assert buckets and sum(b.encode_s for b in buckets) > 0
    for b in buckets:
        e, d = codec_passes(b.steps, 2)
        assert b.encode_s == pytest.approx(e * model.encode_time(spec, 4 * b.numel))
        assert b.decode_s == pytest.approx(d * model.decode_time(spec, 4 * b.numel))


def test_sharded_reduce_scatter_prices_the_codec_on_the_gpu():
    """ZeRO-2's compressed reduce-scatter per unit: the modelled codec on the H100, not the CPU's."""
    kw = dict(model="gpt2-tiny", pp=1, dp=2, micro_batch=2, global_batch=8, bandwidth="1Gbps",
              grad_compress="qsgd-maxnorm:4", zero=2, profile=CPU)
    gpu_plan = _plan(**kw, gpu="h100")[0]
    model = ModelledCodecs(get_gpu("h100"))
    units = gpu_plan.stages[0].units
    assert units and all(u.codec_s > 0 for u in units)
    for u in units:
        e, d = codec_passes(u.rs_steps, 2)
        nbytes = 4 * u.params
        assert u.codec_s == pytest.approx(e * model.encode_time("qsgd-maxnorm:4", nbytes)
                                          + d * model.decode_time("qsgd-maxnorm:4", nbytes))


def test_codec_check_script_reports_both_sources(capsys, tmp_path):
    """scripts/codec_check.py (docs/validation.md's ratios): both tables, their medians; a missing
    input is one line, exit 2."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("codec_check", ROOT / "scripts" / "codec_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main([]) == 0
    out = capsys.readouterr().out
    assert "median over families:" in out and "median from 256 MB, without host floor:" in out
    gpu, rows = mod.kernel_ratios(str(ROOT / "traces" / "gpu" / "h100-kernels-2026-11-27.csv"))
    big = sorted(r2 for _, size, _, r2 in rows if size >= 256e6)  # Triton at the copy bandwidth: 0.86
    assert gpu == "h100-sxm5-80gb" and 0.75 < big[len(big) // 2] < 1.0
    assert mod.main(["--kernels", str(tmp_path / "none.csv")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
