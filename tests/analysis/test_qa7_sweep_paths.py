"""A sweep file's relative paths name files beside it, wherever perfsim runs (qa7 finding F6).

``perfsim sweep sub/sweep.toml`` with ``profile = "prof.json"`` read ``./prof.json`` -- a V100
profile that happened to sit in the working folder -- instead of ``sub/prof.json``, the CPU
profile beside the sweep file: gpt2-tiny pp 2 at 1 Gbps read 0.018 s an iteration instead of
0.081 s, without a word (and with no ``./prof.json``, "no such file")."""

import shutil
from pathlib import Path

import pandas as pd

from perfsim.analysis.sweep import load_sweep_file, run_sweep

ROOT = Path(__file__).resolve().parents[2]


def test_a_sweep_files_relative_paths_are_beside_it(tmp_path, monkeypatch):
    sub = tmp_path / "sub"
    sub.mkdir()
    shutil.copy(ROOT / "traces" / "cpu-2core.json", sub / "prof.json")
    shutil.copy(ROOT / "perfsim" / "data" / "default-v100-aqsgd.json", tmp_path / "prof.json")  # a decoy
    (sub / "topo.toml").write_text('nodes = 2\nbandwidth = "1Gbps"\nlatency = "0ms"\n')
    (sub / "sweep.toml").write_text('model = "gpt2-tiny"\npp = 2\nprofile = "prof.json"\n'
                                    'topology = ["topo.toml", "example-geo"]\n')
    monkeypatch.chdir(tmp_path)
    spec = load_sweep_file("sub/sweep.toml")
    table = run_sweep(spec, None, jobs=1, progress=False).summary
    assert set(table["profile_device"]) == {"cpu (AMD EPYC)"}
    monkeypatch.chdir(sub)  # run beside the file: the same answers
    beside = run_sweep(load_sweep_file("sweep.toml"), None, jobs=1, progress=False).summary
    pd.testing.assert_series_equal(table["iteration_s"], beside["iteration_s"])
    assert len(table) == 2  # a shipped name (example-geo) stays a name
