"""The notebooks run, top to bottom, on the public API (so they never rot).

Executed with nbclient on the ``python3`` kernel (ipykernel). Outputs are
checked, not kept: the notebooks are stored without outputs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def _execute(name: str):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=180, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()
    return nb


def _outputs(nb, output_type=None):
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if output_type is None or out.get("output_type") == output_type:
                yield out


@pytest.mark.parametrize("name", ["speedup_curves.ipynb", "validation.ipynb"])
def test_notebook_is_stored_without_outputs(name):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, name
        source = cell.source
        assert "perfsim.engine" not in source and "._" not in source.replace("_._", ""), \
            f"{name}: use the public API only"


def test_speedup_curves_runs():
    nb = _execute("speedup_curves.ipynb")
    pngs = [o for o in _outputs(nb) if "image/png" in o.get("data", {})]
    assert len(pngs) >= 7  # throughput, speed-up, two breakdowns, DP speed-up, bubble, schedules
    text = "".join(o.get("text", "") for o in _outputs(nb, "stream"))
    assert "10 Mbps: AQ-SGD" in text
    assert "10000 Mbps, FP32: best zb-v" in text  # the smallest bubble when the link is fast
    assert "1000 Mbps, FP32: best zb-h1" in text  # W fills the bubble without extra bytes
    assert "100 Mbps, AQ-SGD fw3 bw6: best zb-h1" in text


def test_validation_runs_on_shipped_results(monkeypatch):
    """On one shipped machine's set of seven tables (the notebook draws a figure per table, ~0.5 s
    each: every folder under traces/validation/ would be 29)."""
    folder = NOTEBOOKS.parent / "traces" / "validation" / "xeon"
    monkeypatch.setenv("PERFSIM_VALIDATION_DIR", str(folder))
    nb = _execute("validation.ipynb")
    text = "".join(o.get("text", "") for o in _outputs(nb, "stream"))
    assert "validation table(s)" in text
    shipped = list(folder.glob("**/validation.csv"))
    assert f"{len(shipped)} validation table(s) in {folder}" in text
    if not shipped:
        assert "No `perfsim validate` results" in text
    else:
        assert any("image/png" in o.get("data", {}) for o in _outputs(nb))


def test_validation_notebook_with_tables(tmp_path, monkeypatch):
    """The with-data path, on tables in the layout `perfsim validate` writes."""
    import numpy as np
    import pandas as pd

    rows = []
    for i, (comp, bw) in enumerate((c, b) for c in ("fp32", "directq:fw4bw8", "aqsgd:fw3bw6")
                                   for b in (1e9, 3e8, 1e8)):
        pred = 100.0 / (1 + 3e8 / bw) * (1 + 0.3 * (comp != "fp32"))
        meas = pred * (1 + 0.03 * np.sin(i))
        rows.append({"model": "digits-mlp", "bandwidth_bps": bw, "latency_s": 0.0,
                     "compress": comp, "grad_compress": "none", "schedule": "1f1b", "pp": 2,
                     "dp": 1, "micro_batch": 8, "macro_batch": 32,
                     "predicted_throughput_samples_per_s": pred,
                     "measured_throughput_samples_per_s": meas,
                     "predicted_iteration_s": 32 / pred, "measured_iteration_s": 32 / meas,
                     "predicted_comm_s": 0.01, "measured_comm_s": 0.012})
    table = tmp_path / "digits-mlp-pp2" / "validation.csv"
    table.parent.mkdir()
    pd.DataFrame(rows).to_csv(table, index=False)
    (tmp_path / "digits-mlp-pp2" / "runs").mkdir()
    (tmp_path / "digits-mlp-pp2" / "runs" / "summary.csv").write_text("not,a,validation\n")
    monkeypatch.setenv("PERFSIM_VALIDATION_DIR", str(tmp_path))
    nb = _execute("validation.ipynb")
    text = "".join(o.get("text", "") for o in _outputs(nb, "stream"))
    assert "1 validation table(s)" in text and "No `perfsim validate`" not in text
    html = "".join(o.get("data", {}).get("text/html", "") for o in _outputs(nb))
    assert "MAPE" in html and "predicted_comm (ms)" in html
    assert sum("image/png" in o.get("data", {}) for o in _outputs(nb)) == 1
