"""Compression of the MoE token all-to-all (``--a2a-compress``): the dispatch-direction pair
(forward dispatch, backward gradient into the expert outputs) at the codec's wire size, the
combine pair at the training precision (DeepSeek-V3, arXiv:2412.19437 Sec. 3.3)."""

from pathlib import Path

import pytest

from perfsim.errors import ConfigError
from perfsim.network import collective_cost

ROOT = Path(__file__).resolve().parents[2]
H100 = "h100-sxm5-80gb"
#: Mixtral-like (gated experts, top-2 of 8), tiny: 4 blocks of hidden 256, 128 tokens a sample
TINY = "llama:layers=4,hidden=256,heads=8,seq=128,vocab=1000,ffn=512,experts=8,top_k=2"
#: one all-to-all's per-rank buffer by hand: 128 tokens x top-2 = 256 rows of 256 values
ROWS, H = 128 * 2, 256
BF16 = ROWS * H * 2  # 131072
FP8 = ROWS * (H + 4 * 2)  # 1 byte a value + an fp32 scale per 128 values: 67584
DIRECTQ4 = ROWS * H * 4 // 8 + 4 * ROWS  # 4-bit codes + one fp32 scale per row: 33792


def _job(a2a="none", **kw):
    job = dict(model=TINY, gpu=H100, tp=1, pp=1, dp=2, ep=2, gpus_per_node=1, precision="bf16",
               nic="1x100Gbps:infiniband", micro_batch=1, global_batch=4, a2a_compress=a2a)
    job.update(kw)
    return job


def _stage_times(a2a, gpu=H100, **kw):
    from perfsim.api import build_configs
    from perfsim.engine.group_times import ep_stage_times
    from perfsim.hardware import get_gpu
    from perfsim.network import Network

    w, s, sy, p = build_configs(**_job(a2a, **kw))
    return ep_stage_times(w, s, Network(sy, s.devices, p), 0, 4, profile=p, gpu=gpu and get_gpu(gpu))


@pytest.mark.parametrize("codec, wire", [("none", BF16), ("fp8", FP8), ("directq:4", DIRECTQ4)])
def test_dispatch_wire_bytes_by_hand(codec, wire):
    from perfsim.api import build_configs
    from perfsim.models.moe import Routing, a2a_wire_bytes

    w, s, _, _ = build_configs(**_job(codec))
    assert a2a_wire_bytes(s.a2a_compress, w.arch, 128, 2, Routing.of(s)) == wire


def test_only_the_dispatch_pair_is_compressed_and_costs_less_across_nodes():
    """4 MoE blocks, ep 2 over two nodes: each GPU sends, per block and direction, one
    all-to-all at the codec's size and one (the combine's) at bf16; without compression two at
    bf16. The fp8 pair takes less time than the bf16 pair over a 100 Gb/s NIC, codec included."""
    fwd0, bwd0, sent0 = _stage_times("none")
    fwd8, bwd8, sent8 = _stage_times("fp8")
    one = lambda n: collective_cost("alltoall", n, 2)[0]  # noqa: E731
    assert sent0 == pytest.approx(2 * 4 * 2 * one(BF16))
    assert sent8 == pytest.approx(2 * 4 * (one(BF16) + one(FP8)))
    assert 0 < fwd8 < fwd0 and bwd8 == fwd8  # no recomputation: the backward mirrors the forward


def test_predict_fp8_dispatch_sends_fewer_all_to_all_bytes_and_says_so():
    import perfsim

    base, fp8 = perfsim.predict(**_job()).summary, perfsim.predict(**_job("fp8")).summary
    assert fp8["ep_bytes"] == pytest.approx(base["ep_bytes"] * (BF16 + FP8) / (2 * BF16))
    assert fp8["peak_memory_gib"] == base["peak_memory_gib"]  # no all-to-all buffer is in the memory model
    assert "dispatch pair sent as fp8 (the combine pair at bf16)" in fp8["model_note"]
    assert "dispatch pair" not in base["model_note"]


@pytest.mark.parametrize("changes, match", [
    (dict(a2a="aqsgd:fw3bw6"), "AQ-SGD needs each sample's previous message"),
    (dict(a2a="qsgd:4"), "gradient compressors do not apply"),
    (dict(a2a="powersgd:2"), "gradient compressors do not apply"),
    (dict(a2a="directq:5"), "bits=5"),
    (dict(a2a="fp8", gpu="a100-sxm4-80gb"), "a100-sxm4-80gb has no fp8"),
])
def test_refusals(changes, match):
    import perfsim

    with pytest.raises(ConfigError, match=match):
        perfsim.predict(**_job(**changes))


def test_ep_1_has_no_all_to_all_and_says_the_codec_is_unused():
    """Not refused (perfsim plan searches ep with the user's codec), priced as without it, noted."""
    import perfsim

    base, fp8 = perfsim.predict(**_job(ep=1)).summary, perfsim.predict(**_job("fp8", ep=1)).summary
    assert fp8["iteration_s"] == base["iteration_s"] and fp8["ep_bytes"] == base["ep_bytes"] == 0
    assert "a2a_compress fp8 unused: no expert-parallel all-to-all with ep 1" in fp8["model_note"]
    assert "unused" not in base["model_note"] and "dispatch pair" not in fp8["model_note"]


def test_fp8_without_a_gpu_preset_is_refused():
    """A profile-priced prediction has no GPU preset, hence no fp8 hardware to assume."""
    with pytest.raises(ConfigError, match="no --gpu given"):
        _stage_times("fp8", gpu=None)


def test_cli_refusal_is_one_line():
    from _helpers import run_cli_here

    r = run_cli_here("predict", "--model", TINY, "--gpu", "a100-sxm4-80gb", "--pp", "1", "--dp", "2", "--ep", "2",
                     "--precision", "bf16", "--global-batch", "4", "--a2a-compress", "fp8")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "a2a_compress='fp8'" in r.stderr
