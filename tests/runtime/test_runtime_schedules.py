"""Execute mode runs interleaved 1F1B, ZB-H1 and ZB-V: real gloo ranks, compression on
every rank-crossing boundary (AQ-SGD's per-sample buffers per boundary), the same
losses as 1F1B with the same boundaries."""

import json

import pytest

from perfsim.schedules import get_schedule, with_comms

from _helpers import PIPE_JOB


def _losses(res):
    return [v for _, v in sorted(res.losses.items())]


def _go(shared_run, **kw):
    """The job (shared with other tests asking for the same one) and its folder."""
    return shared_run(**{**PIPE_JOB, **kw})


def test_zb_h1_same_losses_as_1f1b_with_aqsgd(shared_run):
    """Same stages, same boundaries: ZB-H1's I/W split changes only when weight
    gradients are computed, so losses match 1F1B's to fp tolerance, AQ-SGD included
    (its message buffers see the same ids in the same order per boundary)."""
    spec = "aqsgd:fw3bw6"
    ref, _ = _go(shared_run, pp=2, schedule="1f1b", compress=spec)
    zb, zb_out = _go(shared_run, pp=2, schedule="zb-h1", compress=spec)
    assert zb.summary["schedule"] == "zb-h1"
    assert _losses(zb) == pytest.approx(_losses(ref), rel=1e-5)
    assert zb.summary["pipeline_bytes"] == ref.summary["pipeline_bytes"]
    trace = json.loads((zb_out / "trace.json").read_text())["traceEvents"]
    names = {e["name"] for e in trace if e.get("ph") == "X"}
    assert {"1I0", "1W0", "0I3", "0W3"} <= names  # the split ran as separate actions


def test_interleaved_matches_deeper_1f1b(shared_run):
    """pp=2 with 2 virtual stages cuts the model into the 4 stages of a pp=4 1F1B:
    the same 3 compressed boundaries (seeds per boundary), so the same losses and
    the same wire bytes, on half the ranks."""
    spec = "aqsgd:fw4bw8"
    ref, _ = _go(shared_run, pp=4, schedule="1f1b", compress=spec)
    inter, _ = _go(shared_run, pp=2, schedule="interleaved-1f1b", virtual_stages=2, compress=spec)
    assert _losses(inter) == pytest.approx(_losses(ref), rel=1e-5)
    assert inter.summary["pipeline_bytes"] == ref.summary["pipeline_bytes"]
    assert inter.summary["virtual_stages"] == 2 and inter.summary["partition"] == "1,1,1,1"
    assert [r["layers"] for r in inter.stages] == ["0-0,2-2", "1-1,3-3"]


def test_zb_v_runs_with_local_handoff(shared_run):
    """ZB-V on 2 ranks: stages 1 and 2 share rank 1 (no message), so 2 of the 3
    boundaries carry traffic; losses equal fp32 1F1B's."""
    ref, _ = _go(shared_run, pp=2, schedule="1f1b")
    zbv, _ = _go(shared_run, pp=2, schedule="zb-v")
    assert _losses(zbv) == pytest.approx(_losses(ref), rel=1e-5)
    act = 4 * 256 * 4  # digits-mlp boundary: 4 samples x 256 fp32
    table = get_schedule("zb-v")(2, 4)
    messages = sum(1 for row in with_comms(table) for a in row if a.kind.startswith("SEND"))
    assert messages == 2 * 2 * 4
    assert zbv.summary["pipeline_bytes"] == messages * act
