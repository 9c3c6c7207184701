"""Overflow never becomes Inf (DirectQ / top-k / AQ-SGD) and a diverging run
says so."""


import pytest
import torch

from perfsim.compression.registry import make_compressor
from perfsim.errors import ConfigError
from perfsim.kernels.quant import MAX_ABS

from _helpers import run_cli, run_cli_here

HUGE = torch.tensor([[3e38, -3e38, 1.0, 2.0]])  # finite fp32 values above MAX_ABS
LARGE = torch.tensor([[8e37, -8e37, 1.0, 2.0]])  # just below it


@pytest.mark.parametrize("spec", ["directq:4", "directq:8", "topk:0.5:8"])
def test_quantizers_refuse_values_that_would_decode_to_inf(spec):
    c = make_compressor(spec)
    with pytest.raises(ConfigError, match="exceeds"):
        c.compress(HUGE)
    y = c.decompress(c.compress(LARGE))
    assert bool(torch.isfinite(y).all()) and float(y.abs().max()) <= 1.01 * MAX_ABS


def test_aqsgd_never_stores_inf():
    send, recv = make_compressor("aqsgd:4"), make_compressor("aqsgd:4")
    key = torch.tensor([0])
    recv.decompress(send.compress(LARGE, key=key), key=key)  # first epoch: stored as is
    for x in (-LARGE * 1.05, HUGE):  # a delta, then values, above the limit: refused
        with pytest.raises(ConfigError, match="exceeds|NaN or Inf"):
            send.compress(x, key=key)
    for c in (send, recv):
        assert bool(torch.isfinite(c.store.get([0], torch.device("cpu"))).all())
    y = recv.decompress(send.compress(LARGE * 0.5, key=key), key=key)
    assert bool(torch.isfinite(y).all())


@pytest.mark.parametrize("compress", ["directq:fw8bw8", "fp32"])
def test_diverging_run_says_so_and_exits_1(tmp_path, compress):
    cli = run_cli if compress == "directq:fw8bw8" else run_cli_here  # the first in a real process
    proc = cli("run", "--model", "digits-mlp", "--pp", "2", "--schedule", "1f1b", "--steps", "30", "--lr", "1e6",
                   "--optimizer", "sgd",
                   "--compress", compress, "--micro-batch", "4", "--macro-batch", "16", "--out", str(tmp_path / "d"),
                   "--no-progress", **({"timeout": 180} if cli is run_cli else {}))
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "training diverged at step" in proc.stderr and ", stage " in proc.stderr
    assert "try a lower learning rate" in proc.stderr and "NaN" not in proc.stderr
