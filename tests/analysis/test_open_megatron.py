"""Megatron-LM's weak-scaling table (arXiv:2104.04473, Table 1) as open multi-node data:
the stored transcription is self-consistent, and scripts/megatron_open_data.py predicts its
rows and reports the signed error (nothing fitted to them)."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("megatron_open_data", ROOT / "scripts" / "megatron_open_data.py")
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)


@pytest.fixture(scope="module")
def table():
    return mod.load()


def test_transcription_is_consistent_with_the_papers_own_formulas(table):
    doc, rows = table
    V, s = doc["workload"]["vocab"], doc["workload"]["seq_len"]
    assert len(rows) == 10 and doc["source"].startswith("Narayanan et al.") and "arXiv:2104.04473" in doc["source"]
    for r in rows:
        # eq. (2): the parameter count from layers and hidden size (1.7 B is 1.65 by it, 3.6 is 3.56)
        assert mod.param_count(r, V, s) / 1e9 == pytest.approx(r["params_b"], rel=0.03), r
        assert r["gpus"] % (r["tp"] * r["pp"]) == 0 and r["tp"] <= 8
        assert r["global_batch"] % (r["gpus"] // (r["tp"] * r["pp"])) == 0
        # aggregate = per GPU x GPUs; % of the A100's 312 TFLOP/s fp16 peak
        assert r["aggregate_pflops"] == pytest.approx(r["tflops_per_gpu"] * r["gpus"] / 1e3, rel=0.01), r
        assert r["percent_peak"] == pytest.approx(100 * r["tflops_per_gpu"] / 312, abs=0.6), r
    # measured time back from eq. (3): the 1T row runs ~103 s per iteration
    assert mod.measured_time(rows[-1], V, s) == pytest.approx(102.6, abs=0.1)


def test_rows_are_predicted_with_signed_errors(table):
    doc, rows = table
    V, s = doc["workload"]["vocab"], doc["workload"]["seq_len"]
    res = mod.evaluate(doc, [rows[0], rows[2], rows[4]])  # dp only, tp 4, tp 8 x pp 2 across nodes
    for r in res:
        assert r["predicted_tflops"] * 1e12 * r["predicted_s"] * r["gpus"] == pytest.approx(mod.model_flops(r, V, s))
        assert r["error"] == pytest.approx((r["predicted_s"] - r["measured_s"]) / r["measured_s"])
        assert abs(r["error"]) < 0.3, r  # a mechanism gone wrong shows here first
        assert r["fits"]
    assert res[2]["dp_sync_s"] > 0 and res[2]["tp_comm_s"] > 0
    m, signed = mod.summary(res)
    assert m >= abs(signed)


def test_cli_prints_mape_and_signed_error(capsys):
    assert mod.main(["--micro-batch", "x"]) == 2
    assert "bad --micro-batch" in capsys.readouterr().err


def test_each_pipeline_candidate_is_a_predict_switch_with_a_reason_and_moves_the_row(table):
    from perfsim.params import PARAMS

    names = {p.name for p in PARAMS}
    for label, kw, why in mod.CANDIDATES:
        assert set(kw) <= names and why, label
    doc, rows = table
    out = dict((label, res[0]) for label, _, res in mod.candidates(doc, [rows[4]]))  # tp 8 x pp 2 across nodes
    assert list(out) == ["as stated"] + [c[0] for c in mod.CANDIDATES]
    stated = out["as stated"]
    assert out["p2p bandwidth: half the NIC rate"]["predicted_s"] > stated["predicted_s"]
    assert out["p2p latency per hop"]["predicted_s"] > stated["predicted_s"]
    # the factor that would make the row's compute (and its bubble) meet the measurement
    k = mod.compute_factor(stated)
    assert stated["predicted_s"] + (k - 1) * (stated["compute_s"] + stated["idle_s"]) == \
        pytest.approx(stated["measured_s"])


def test_interleaved_rows_get_the_chunk_counts_megatron_accepts():
    # each chunk a whole number of layers: the 529.6B row's 3 layers per device -> 3, 1T's 2 -> 2
    assert [mod.megatron_chunks(n) for n in (10, 6, 3, 2, 15, 1)] == [2, 2, 3, 2, 3, 1]
