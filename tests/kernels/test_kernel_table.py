"""scripts/kernel_table.py: the kernel tables of docs/gpu.md and README.md are the stored run's
figures (no hand-copied numbers): --check passes on the repository and fails on an edited figure."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SCRIPT = os.path.join(ROOT, "scripts", "kernel_table.py")
ACCEPTED = os.path.join(ROOT, "traces", "gpu", "h100-kernels-2026-11-27.csv")
BISECT = os.path.join(ROOT, "traces", "gpu", "h100-bisect-2026-11-27.csv")


def table(*args):
    p = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def copy_docs(tmp_path):
    (tmp_path / "docs").mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "README.md"), tmp_path / "README.md")
    shutil.copy(os.path.join(ROOT, "docs", "gpu.md"), tmp_path / "docs" / "gpu.md")
    return tmp_path


def test_docs_match_the_stored_runs():
    rc, out, err = table(ACCEPTED, "--bisect", BISECT, "--check")
    assert rc == 0, err
    with open(os.path.join(ROOT, "docs", "gpu.md"), encoding="utf-8") as f:
        gpu = f.read()
    assert "Measured 2026-11-27 on an NVIDIA H100 80GB HBM3" in gpu
    assert "| encode 2/3/4/8 bit (single pass) |" in gpu and "| bbe8f3b |" in gpu


def test_an_edited_figure_is_stale_and_the_script_restores_it(tmp_path):
    root = copy_docs(tmp_path)
    readme = root / "README.md"
    text = readme.read_text(encoding="utf-8")
    start = text.index("| decode 2/3/4/8 bit |")
    row = text[start:text.index("\n", start)]
    readme.write_text(text.replace(row, row.replace("%", "% ", 1)), encoding="utf-8")
    rc, _, err = table(ACCEPTED, "--bisect", BISECT, "--check", "--root", str(root))
    assert rc == 1 and "README.md" in err and "docs/gpu.md" not in err
    assert table(ACCEPTED, "--bisect", BISECT, "--root", str(root))[0] == 0
    assert readme.read_text(encoding="utf-8") == text
    assert table(ACCEPTED, "--bisect", BISECT, "--check", "--root", str(root))[0] == 0


def test_missing_block_or_undated_csv_is_exit_2(tmp_path):
    root = copy_docs(tmp_path)
    gpu = root / "docs" / "gpu.md"
    gpu.write_text(gpu.read_text(encoding="utf-8").replace("<!-- kernel-table:full", "<!-- x"), encoding="utf-8")
    rc, _, err = table(ACCEPTED, "--root", str(root))
    assert rc == 2 and "kernel-table:full" in err and len(err.strip().splitlines()) == 1
    old = os.path.join(ROOT, "traces", "gpu", "h100-kernels-2026-11-23.csv")  # no device/date columns
    rc, _, err = table(old, "--root", str(copy_docs(tmp_path / "b")))
    assert rc == 2 and "device and date" in err
