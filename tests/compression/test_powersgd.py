"""PowerSGD through torch's own powerSGD_hook: sizes match the hook's decisions, and
allreduce_mean runs the hook for real over gloo."""

import pytest
import torch

from perfsim.compression import make_compressor
from perfsim.compression.powersgd import PowerSGD
from perfsim.errors import ConfigError

from _helpers import gloo_group, run_ranks, save_rank


def test_spec():
    c = make_compressor("powersgd:4")
    assert isinstance(c, PowerSGD) and (c.rank, c.start, c.min_rate) == (4, 2, 2.0)
    c = make_compressor("powersgd:2:start=10:min_rate=1.5")
    assert (c.rank, c.start, c.min_rate) == (2, 10, 1.5) and make_compressor(c.spec).spec == c.spec


@pytest.mark.parametrize("bad", ["powersgd", "powersgd:0", "powersgd:x", "powersgd:2:start=1",
                                 "powersgd:2:min_rate=0", "powersgd:2:foo=3", "powersgd:2:3"])
def test_bad_spec(bad):
    with pytest.raises(ConfigError):
        make_compressor(bad)


@pytest.mark.parametrize("shape", [(1024, 1600), (768, 3, 3, 3), (10,), (4, 4), (50, 3), (1, 1000), (64, 64), (0,)])
@pytest.mark.parametrize("rank", [1, 4])
def test_wire_bytes_follow_torch_should_compress(shape, rank):
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

    c = make_compressor(f"powersgd:{rank}")
    numel = 1
    for d in shape:
        numel *= d
    assert c.wire_bytes(shape, warmup=True) == 4 * numel
    if numel == 0:
        assert c.wire_bytes(shape) == 0
        return
    n = shape[0]
    m = numel // n
    r = min(n, m, rank)
    ok, _, compressed = _should_compress(n, m, r, 2)
    assert c.wire_bytes(shape) == (4 * compressed if ok else 4 * numel)
    plan = c.dp_plan(shape, 8)
    assert sum(s.nbytes for s in plan) == c.wire_bytes(shape)
    assert len(plan) == (2 if ok else 1)


def test_large_matrix_ratio():
    c = make_compressor("powersgd:4")
    assert c.wire_bytes((1024, 1600)) == 4 * 4 * (1024 + 1600)
    assert [s.label.split()[-1] for s in c.dp_plan((1024, 1600), 4)] == ["P", "Q"]


def test_single_tensor_compress_is_a_clear_error():
    c = make_compressor("powersgd:2")
    with pytest.raises(ConfigError, match="DDP communication hook"):
        c.compress(torch.randn(8, 8))
    with pytest.raises(ConfigError):
        c.decompress(None)


def _worker(rank, port, world, out_dir):
    with gloo_group(rank, world, port):
        torch.manual_seed(0)
        u = torch.randn(40, 2)  # shared column space -> the mean is exactly rank 2
        torch.manual_seed(10 + rank)
        c = make_compressor("powersgd:2:start=2", seed=0)
        outs, xs = [], []
        for step in range(4):
            x = u @ torch.randn(30, 2).T
            xs.append(x)
            outs.append(c.allreduce_mean(x.clone(), name="w"))
        bias = torch.randn(30)
        bias_out = c.allreduce_mean(bias.clone(), name="b")
        save_rank(out_dir, rank, {"xs": xs, "outs": outs, "bias": bias, "bias_out": bias_out,
                                  "state": c.state_dict()})


def test_torch_hook_over_gloo(tmp_path):
    world = 2
    res = run_ranks(_worker, tmp_path, world, world=world)
    for step in range(4):
        mean = (res[0]["xs"][step] + res[1]["xs"][step]) / 2
        torch.testing.assert_close(res[0]["outs"][step], res[1]["outs"][step])
        # steps 0-1: the hook's plain allreduce; later: rank-2 PowerSGD, exact for a rank-2 mean
        torch.testing.assert_close(res[0]["outs"][step], mean, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(res[0]["bias_out"], (res[0]["bias"] + res[1]["bias"]) / 2)
    st = res[0]["state"]
    assert st["iter"] == 5 and set(st["error"]) == {0, 1} and 0 in st["p"]
    c = make_compressor("powersgd:2:start=2")
    c.load_state_dict(st)
    assert c.state_dict()["iter"] == 5
