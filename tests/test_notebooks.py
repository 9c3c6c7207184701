"""The notebooks run, top to bottom, on the public API (so they never rot).

Executed with nbclient on the ``python3`` kernel (ipykernel). Outputs are
checked, not kept: the notebooks are stored without outputs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


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
    assert len(pngs) >= 6  # throughput, speed-up, two breakdowns, DP speed-up, bubble
    text = "".join(o.get("text", "") for o in _outputs(nb, "stream"))
    assert "10 Mbps: AQ-SGD" in text


def test_validation_runs():
    nb = _execute("validation.ipynb")
    text = "".join(o.get("text", "") for o in _outputs(nb, "stream"))
    assert "validation table(s)" in text
    shipped = list((NOTEBOOKS.parent / "traces" / "validation").glob("**/*.csv"))
    if not shipped:
        assert "No `perfsim validate` results" in text
    else:
        assert any("image/png" in o.get("data", {}) for o in _outputs(nb))
