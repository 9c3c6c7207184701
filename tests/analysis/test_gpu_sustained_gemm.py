"""scripts/gpu_sustained_gemm.py: the device check of a GEMM rate under sustained load. Its summary
(first window against the steady half) is checked here on made-up windows; the GEMMs themselves
need a CUDA GPU, and without one the script says so in one line and exits 2."""

import pytest
import torch

from _helpers import load_script

mod = load_script("gpu_sustained_gemm")


def test_steady_rate_is_the_median_of_the_last_half_against_the_first_window():
    rates = [100.0, 99.0, 97.0, 95.0, 91.0, 90.0, 90.0, 89.0]
    windows = [{"tflops": r, "clock_mhz": 1980 - 40 * i, "power_w": 700.0} for i, r in enumerate(rates)]
    s = mod.summarize(windows)
    assert s["first_tflops"] == 100.0 and s["windows"] == 8
    assert s["steady_tflops"] == pytest.approx(90.0)  # median of 91, 90, 90, 89
    assert s["steady_over_first"] == pytest.approx(0.90)
    assert s["steady_clock_mhz"] == pytest.approx((1980 - 40 * 5 + 1980 - 40 * 6) / 2)
    assert s["steady_power_w"] == 700.0


def test_windows_without_samples_give_rates_only_and_none_is_an_error():
    s = mod.summarize([{"tflops": 50.0}, {"tflops": 40.0}])
    assert s["steady_tflops"] == 40.0 and s["steady_clock_mhz"] is None and s["steady_power_w"] is None
    with pytest.raises(ValueError):
        mod.summarize([])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message a machine without CUDA gets")
def test_without_cuda_it_says_so_and_exits_2(capsys):
    assert mod.main(["--seconds", "1"]) == 2
    assert capsys.readouterr().err.strip() == "gpu_sustained_gemm: no CUDA device"
