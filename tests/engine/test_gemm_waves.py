"""GEMM tile and wave quantization (perfsim.engine.gemm_waves; NVIDIA's "Matrix Multiplication
Background" guide, Sec. 3): tile and wave counts by hand, a full last wave loses nothing, one tile
over costs a wave, and the switch reaches op_time, the backward and calibrate_a100.py."""

import importlib.util
import math
from dataclasses import replace
from pathlib import Path

import pytest

from perfsim import hardware
from perfsim.engine.compute import gemm_backward_time, op_time, transformer_times
from perfsim.engine.gemm_waves import GEMM_TILES, K_STEP_BYTES, best_plan, plan, quantized_seconds
from perfsim.errors import ConfigError
from perfsim.models.ops import Op
from perfsim.models.registry import get_spec

A100 = hardware.get_gpu("a100-sxm4-80gb")
RATE = A100.peak("fp16") * A100.curve.eff_max  # the curve's large-GEMM rate
SM_FLOPS, SM_L2 = RATE / 108, A100.l2_Bps / 108


def _curve(mode):
    return replace(A100.curve, kernel_s=0.0, knee=0.0, gemm_quantization=mode)


def test_a100_sm_count_and_l2_from_the_whitepaper():
    for name in ("a100-sxm4-40gb", "a100-sxm4-80gb", "a100-pcie-40gb", "a100-pcie-80gb"):
        g = hardware.get_gpu(name)
        assert g.sms == 108 and g.l2_Bps == pytest.approx(5120 * 1.41e9)
    assert GEMM_TILES[0] == (256, 128) and GEMM_TILES[-1] == (64, 64) and len(set(GEMM_TILES)) == 8


def test_tile_and_wave_counts_by_hand():
    # 3072 x 2048 x 768 (NVIDIA/cutlass#430's cuBLAS shape) in 256 x 128 tiles: 12 x 16 = 192 tiles,
    # 2 waves on 108 SMs (the second 84/108 full); k = 768 = 24 steps of 32 fp16 values
    p = plan(3072, 2048, 768, 1, (256, 128), 108, SM_FLOPS, SM_L2, 2)
    assert (p.tiles, p.waves, p.k_steps) == (192, 2, 24)
    # an edge tile: 3073 rows need a 13th row of tiles
    assert plan(3073, 2048, 768, 1, (256, 128), 108, SM_FLOPS, SM_L2, 2).tiles == 13 * 16
    # batched GEMMs multiply the tiles; k rounds up to whole steps
    q = plan(2048, 2048, 100, 16, (128, 128), 108, SM_FLOPS, SM_L2, 2)
    assert (q.tiles, q.waves, q.k_steps) == (16 * 16 * 16, math.ceil(4096 / 108), 4)
    # a step of a 256 x 128 tile is compute-bound (intensity 85 FLOP/B > the A100's 43 per L2 byte):
    # 2 Tm Tn Tk / P_sm, plus one step's operands in (prologue) and the tile's outputs out (epilogue)
    tk = K_STEP_BYTES // 2
    step = 2 * 256 * 128 * tk / SM_FLOPS
    assert (256 + 128) * tk * 2 / SM_L2 < step
    assert p.tile_s == pytest.approx(24 * step + (256 + 128) * tk * 2 / SM_L2 + 256 * 128 * 2 / SM_L2)
    # a 64 x 64 tile is fed slower than it computes (intensity 32 < 43): its step is the L2's
    r = plan(64, 64, 64, 1, (64, 64), 108, SM_FLOPS, SM_L2, 2)
    assert r.tile_s == pytest.approx((2 + 1) * (128 * tk * 2 / SM_L2) + 64 * 64 * 2 / SM_L2)


def test_the_least_time_tile_is_chosen():
    # 3072 x 1152: exactly 108 tiles of 256 x 128 (12 x 9), the most efficient tile, one full wave
    best = best_plan(3072, 1152, 4096, 1, A100, RATE, 2)
    assert best.tile == (256, 128) and (best.tiles, best.waves) == (108, 1)
    # every candidate is at least as slow
    assert all(plan(3072, 1152, 4096, 1, t, 108, SM_FLOPS, SM_L2, 2).seconds >= best.seconds for t in GEMM_TILES)
    # 1024^3: 256 x 128 needs 32 tiles (one wave with 76 SMs idle); 64 x 64's 256 tiles in 3 waves do better
    small = best_plan(1024, 1024, 1024, 1, A100, RATE, 2)
    assert small.tile != (256, 128)
    assert small.seconds < plan(1024, 1024, 1024, 1, (256, 128), 108, SM_FLOPS, SM_L2, 2).seconds


def test_full_waves_lose_nothing_and_one_tile_over_costs_a_wave():
    k = 4096
    full = plan(256, 128, k, 108, (256, 128), 108, SM_FLOPS, SM_L2, 2)  # 108 tiles: one full wave
    over = plan(256, 128, k, 109, (256, 128), 108, SM_FLOPS, SM_L2, 2)  # one tile more
    assert (full.waves, over.waves) == (1, 2)
    assert over.seconds == pytest.approx(2 * full.seconds)  # 1/109 more work, a whole wave more time
    # a full wave runs at the curve's rate, plus only the tile's prologue and epilogue (1.2 % at k 4096)
    ideal = 2.0 * 256 * 128 * k * 108 / RATE
    tk = K_STEP_BYTES // 2
    assert full.seconds == pytest.approx(ideal + ((256 + 128) * tk * 2 + 256 * 128 * 2) / SM_L2)
    assert full.seconds < 1.013 * ideal
    # the library re-tiles the 109 GEMMs: less than the whole wave lost, more than nothing
    best = best_plan(256, 128, k, 109, A100, RATE, 2)
    assert full.seconds * 109 / 108 < best.seconds < over.seconds


def test_op_time_switch():
    op = Op("gemm", 3072, 2048, 768)
    off, waves = (op_time(op, A100, "fp16", _curve(m), 2) for m in ("off", "waves"))
    assert off == pytest.approx(op.flops / RATE)
    assert waves == pytest.approx(quantized_seconds(3072, 2048, 768, 1, A100, RATE, 2))
    assert 1.15 < waves / off < 1.3  # the second wave 84/108 full, plus the short k loop's overhead
    # the other factors still multiply: the LM head's share
    head = replace(op, lm_head=True)
    assert op_time(head, A100, "fp16", _curve("waves"), 2) == pytest.approx(waves / A100.curve.lm_head_eff)


def test_backward_prices_its_own_gemms():
    op = Op("mlp_down", 2048, 1024, 6144)  # dA: 2048 x 6144 (inner 1024); dB: 6144 x 1024 (inner 2048)
    off = _curve("off")
    assert gemm_backward_time(op, A100, "fp16", off, 2) == pytest.approx(2 * op_time(op, A100, "fp16", off, 2))
    waves = _curve("waves")
    expect = (quantized_seconds(2048, 6144, 1024, 1, A100, RATE, 2)
              + quantized_seconds(6144, 1024, 2048, 1, A100, RATE, 2))
    assert gemm_backward_time(op, A100, "fp16", waves, 2) == pytest.approx(expect)
    # a whole transformer: slower with waves, forward and backward
    spec = get_spec("gpt:layers=2,hidden=1024,heads=16,seq=1024,vocab=50304")
    f0, b0 = transformer_times(spec, A100, "fp16", 2, 1, False, "none", replace(A100.curve))
    f1, b1 = transformer_times(spec, A100, "fp16", 2, 1, False, "none",
                               replace(A100.curve, gemm_quantization="waves"))
    assert sum(f1) > sum(f0) and sum(b1) > sum(b0)


def test_bad_mode_and_gpu_without_sms_are_refused():
    with pytest.raises(ConfigError, match="gemm_quantization"):
        replace(A100.curve, gemm_quantization="tiles")
    h100 = hardware.get_gpu("h100")
    with pytest.raises(ConfigError, match="h100-sxm5-80gb has no SM count"):
        op_time(Op("gemm", 4096, 4096, 4096), h100, "bf16", replace(h100.curve, gemm_quantization="waves"), 2)


def test_curve_source_says_so():
    gpu = replace(A100, curve=replace(A100.curve, gemm_quantization="waves"))
    assert "wave quantization over 108 SMs" in hardware.curve_for(gpu)[1]
    assert "wave" not in hardware.curve_for(A100)[1]


ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("calibrate_a100", ROOT / "scripts" / "calibrate_a100.py")
cal = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cal)


def test_calibrate_flag_reaches_every_prediction(monkeypatch):
    monkeypatch.setitem(hardware.GPUS, cal.A100, hardware.GPUS[cal.A100])  # restored after the test
    monkeypatch.setattr(cal, "GEMM_QUANTIZATION", None)
    row = dict(gpus=8, global_batch=64, micro_batch=4, hidden=2048, heads=16, layers=8, seq=1024, tp=8, dp=1, pp=1)
    base = cal.predict_row(row)
    cal.set_gemm_quantization("waves")
    assert cal.GEMM_QUANTIZATION == "waves" and hardware.GPUS[cal.A100].curve.gemm_quantization == "waves"
    cal.set_curve([0.85, 0.0, 0.8, 59.0, 100.0, 58.0, 0.76])  # a fit step keeps the switch
    assert hardware.GPUS[cal.A100].curve.gemm_quantization == "waves"
    cal.set_curve([cal.to_fit_units(n, getattr(hardware.A100_CURVE, n)) for n in cal.FIELDS])
    assert cal.predict_row(row) > base


def test_calibrate_bad_flag_is_refused(capsys, monkeypatch):
    monkeypatch.setitem(hardware.GPUS, cal.A100, hardware.GPUS[cal.A100])
    monkeypatch.setattr(cal, "GEMM_QUANTIZATION", None)
    if cal.data_path() is None:
        pytest.skip("../shared/data/a100-single-node not present")
    assert cal.main(["--check", "--gemm-quantization", "tiles"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "gemm_quantization" in err
