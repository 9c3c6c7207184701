"""Execute mode runs interleaved 1F1B, ZB-H1 and ZB-V: real gloo ranks, compression on
every rank-crossing boundary (AQ-SGD's per-sample buffers per boundary), the same
losses as 1F1B with the same boundaries."""

import json

import pytest

from perfsim.runtime import run
from perfsim.schedules import get_schedule, with_comms

FAST = dict(model="digits-mlp", micro_batch=4, macro_batch=16, steps=6, dataset_limit=32, timeout="60s")


def _losses(res):
    return [v for _, v in sorted(res.losses.items())]


def _go(tmp_path, name, **kw):
    return run(out=str(tmp_path / name), **{**FAST, **kw})


def test_zb_h1_same_losses_as_1f1b_with_aqsgd(tmp_path):
    """Same stages, same boundaries: ZB-H1's I/W split changes only when weight
    gradients are computed, so losses match 1F1B's to fp tolerance, AQ-SGD included
    (its message buffers see the same ids in the same order per boundary)."""
    spec = "aqsgd:fw3bw6"
    ref = _go(tmp_path, "1f1b", pp=2, schedule="1f1b", compress=spec)
    zb = _go(tmp_path, "zbh1", pp=2, schedule="zb-h1", compress=spec)
    assert zb.summary["schedule"] == "zb-h1"
    assert _losses(zb) == pytest.approx(_losses(ref), rel=1e-5)
    assert zb.summary["pipeline_bytes"] == ref.summary["pipeline_bytes"]
    trace = json.loads((tmp_path / "zbh1" / "trace.json").read_text())["traceEvents"]
    names = {e["name"] for e in trace if e.get("ph") == "X"}
    assert {"1I0", "1W0", "0I3", "0W3"} <= names  # the split ran as separate actions


def test_interleaved_matches_deeper_1f1b(tmp_path):
    """pp=2 with 2 virtual stages cuts the model into the 4 stages of a pp=4 1F1B:
    the same 3 compressed boundaries (seeds per boundary), so the same losses and
    the same wire bytes, on half the ranks."""
    spec = "aqsgd:fw4bw8"
    ref = _go(tmp_path, "1f1b4", pp=4, schedule="1f1b", compress=spec)
    inter = _go(tmp_path, "inter", pp=2, schedule="interleaved-1f1b", virtual_stages=2, compress=spec)
    assert _losses(inter) == pytest.approx(_losses(ref), rel=1e-5)
    assert inter.summary["pipeline_bytes"] == ref.summary["pipeline_bytes"]
    assert inter.summary["virtual_stages"] == 2 and inter.summary["partition"] == "1,1,1,1"
    assert [r["layers"] for r in inter.stages] == ["0-0,2-2", "1-1,3-3"]


def test_zb_v_runs_with_local_handoff(tmp_path):
    """ZB-V on 2 ranks: stages 1 and 2 share rank 1 (no message), so 2 of the 3
    boundaries carry traffic; losses equal fp32 1F1B's."""
    ref = _go(tmp_path, "ref", pp=2, schedule="1f1b")
    zbv = _go(tmp_path, "zbv", pp=2, schedule="zb-v")
    assert _losses(zbv) == pytest.approx(_losses(ref), rel=1e-5)
    act = 4 * 256 * 4  # digits-mlp boundary: 4 samples x 256 fp32
    table = get_schedule("zb-v")(2, 4)
    messages = sum(1 for row in with_comms(table) for a in row if a.kind.startswith("SEND"))
    assert messages == 2 * 2 * 4
    assert zbv.summary["pipeline_bytes"] == messages * act
