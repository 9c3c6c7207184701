"""Cited A100 GEMM measurements (traces/open/gemm-a100-*.json) and scripts/gemm_cited_check.py:
every number is read from the quote its file stores, and the script's arithmetic (cited rate,
perfsim's price through op_time, signed error, groups) is the arithmetic it states. No accuracy
threshold: the errors are what they are (docs/validation.md)."""

import importlib.util
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from perfsim.engine.compute import op_time
from perfsim.hardware import A100_CURVE, GPUS
from perfsim.models.ops import Op

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("gemm_cited_check", ROOT / "scripts" / "gemm_cited_check.py")
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
FILES = sorted((ROOT / "traces" / "open").glob("gemm-a100-*.json"))


@pytest.fixture(scope="module")
def results():
    return mod.evaluate(mod.load())


def _numbers(text: str) -> set[float]:
    return {float(x) for x in re.findall(r"\d+(?:\.\d+)?", text)}


def test_every_file_cites_its_source_and_every_number_is_in_its_quote():
    assert len(FILES) >= 5
    for path in FILES:
        doc = json.loads(path.read_text())
        src = doc["source"]
        assert src["url"].startswith("https://") and src["date"] and src["not_stated"], path.name
        assert doc["gpu"] in GPUS and doc["measurements"], path.name
        quoted = _numbers(src["quoted"])
        for m in doc["measurements"]:
            assert m.get("gpu", doc["gpu"]) in GPUS and m["dtype"] in ("fp16", "bf16")
            assert "time_ms" in m or "tflops_stated" in m, (path.name, m)
            # the figures are transcribed from the quote, not computed or remembered
            for key in ("tflops_stated",):
                if key in m:
                    assert float(m[key]) in quoted, (path.name, key, m[key])
            if "time_ms" in m:
                t = m["time_ms"]
                assert t in quoted or round(t * 1e3, 6) in quoted, (path.name, t)  # ms or us in the text
            # the shape is in the quote (as MxNxK, M=..., or an NxN square) or the method text says it
            text = src["quoted"] + src.get("method_quoted", "")
            assert {m["m"], m["n"], m["k"]} <= _numbers(text) | _numbers(text.replace("x", " ")), (path.name, m)


def test_cited_rate_is_2mnk_over_the_stated_time_and_inconsistent_figures_are_flagged(results):
    by = {(r["file"], r["provider"], r["software"], r["m"], r["dtype"]): r for r in results}
    cublas11 = by[("gemm-a100-cutlass-discussion-241.json", "cublas", "CUDA 11.0", 8192, "fp16")]
    assert cublas11["cited_tflops"] == pytest.approx(2 * 8192 ** 3 / 3.71e-3 / 1e12)
    assert cublas11["stated_consistent"] is True  # 296.4 against the stated 297
    cutlass11 = by[("gemm-a100-cutlass-discussion-241.json", "cutlass", "CUDA 11.0", 8192, "fp16")]
    assert cutlass11["cited_tflops"] == pytest.approx(258.7, abs=0.05) and cutlass11["stated_consistent"] is False
    for r in results:
        if "time_ms" not in r:
            assert r["cited_tflops"] == r["tflops_stated"] and r["stated_consistent"] is None


def test_predicted_rate_is_op_time_on_the_presets_curve(results):
    for r in results:
        gpu = GPUS[r["gpu"]]
        op = Op("gemm", r["m"], r["n"], r["k"])
        device = replace(A100_CURVE, kernel_s=0.0)
        t = op_time(op, gpu, r["dtype"], device, 2)
        assert r["predicted_tflops"] == pytest.approx(op.flops / t / 1e12, rel=1e-12)
        with_floor = op_time(op, gpu, r["dtype"], gpu.curve, 2)
        assert r["predicted_floor_tflops"] == pytest.approx(op.flops / with_floor / 1e12, rel=1e-12)
        # the sign: negative where perfsim's curve is slower than the measured kernel
        assert r["error"] == pytest.approx(r["predicted_tflops"] / r["cited_tflops"] - 1)
        assert (r["error"] < 0) == (r["predicted_tflops"] < r["cited_tflops"])
        # a large aligned GEMM runs at the curve's asymptote, eff_max x peak, and never above it
        assert r["predicted_tflops"] <= A100_CURVE.eff_max * gpu.peak(r["dtype"]) / 1e12 * (1 + 1e-12)
    # the 3072x2048x768 kernel (62.4 us) is shorter than predict's host floor of one operator
    short = [r for r in results if r["m"] == 3072]
    assert short and all(r["predicted_floor_tflops"] < r["predicted_tflops"] for r in short)


def test_groups_and_size_classes(results):
    assert mod.size_class(8192, 8192, 8192) == "large" and mod.size_class(3072, 2048, 768) == "medium"
    assert mod.size_class(2048, 4096, 100) == "small"
    assert mod.form_factor("A100_SXM_40GB") == "sxm4" and mod.form_factor("NVIDIA A100-PCIE-40GB") == "pcie"
    assert mod.form_factor("A100 80GB (form factor not stated)") == "unstated"
    g = mod.groups(results)
    assert sum(len(v) for v in g.values()) == len(results)
    for (gen, form, size), rs in g.items():
        assert all((r["generation"], r["form"], r["size"]) == (gen, form, size) for r in rs)
    assert ("cuda-11.0-11.3", "sxm4", "large") in g and ("cuda-12", "sxm4", "large") in g


def test_table1_gemms_are_block_ops_priced_by_op_time():
    t1 = mod.table1_gemms()
    assert len(t1) == 10
    first = t1[0]  # 1.7 B: hidden 2304, t 1, micro-batch 16, sequence 2048
    assert {name for name, *_ in first["shapes"]} == {"qkv", "proj", "mlp_up", "mlp_down"}
    assert ("qkv", 16 * 2048, 3 * 2304, 2304) in first["shapes"]
    for t in t1:
        assert 0 < t["of_peak"] <= A100_CURVE.eff_max


def test_script_runs_and_writes_json(tmp_path, capsys):
    assert mod.main([]) == 0
    out = capsys.readouterr().out
    assert "cuda-11.0-11.3" in out and "Table 1" in out
    path = tmp_path / "rows.json"
    assert mod.main(["--json", str(path)]) == 0
    data = json.loads(path.read_text())
    assert len(data["measurements"]) == sum(len(json.loads(f.read_text())["measurements"]) for f in FILES)


def test_gemm_quantization_flag_prices_with_waves_and_restores(capsys):
    """``--gemm-quantization waves``: every shape priced with the curve's ``gemm_quantization``
    (perfsim.engine.gemm_waves); 3072x2048x768 (cutlass#430) two waves of 256x128 tiles: 0.736 of
    peak where the flat curve gives 0.884 (docs/validation.md, "GEMM tile and wave quantization")."""
    from perfsim.engine.gemm_waves import quantized_seconds

    assert mod.main(["--gemm-quantization", "waves"]) == 0 and mod.CURVE_FIELDS == {}
    out = capsys.readouterr().out
    assert "gemm_quantization': 'waves'" in out
    gpu = GPUS["a100-sxm4-80gb"]
    mod.CURVE_FIELDS["gemm_quantization"] = "waves"
    try:
        waves = mod.predicted_tflops(3072, 2048, 768, "a100-sxm4-80gb", "fp16")
    finally:
        mod.CURVE_FIELDS.clear()
    rate = gpu.peak("fp16") * A100_CURVE.eff_max
    knee = A100_CURVE.knee
    g = (3072 / (3072 + knee)) * (2048 / (2048 + knee)) * (768 / (768 + knee))
    secs = quantized_seconds(3072, 2048, 768, 1, gpu, rate, 2) / g
    assert waves == pytest.approx(2 * 3072 * 2048 * 768 / secs / 1e12)
    assert waves / 312 == pytest.approx(0.736, abs=5e-4)
    assert mod.predicted_tflops(3072, 2048, 768, "a100-sxm4-80gb", "fp16") / 312 == pytest.approx(0.884, abs=5e-4)
    assert mod.main(["--gemm-quantization", "tiles"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "gemm_quantization" in err
