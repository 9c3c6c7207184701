""".ci/run: the README's `make test`, a time limit, and pytest's "no tests" as a failure."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ci(tmp_path, make_script: str, **env):
    (tmp_path / ".ci").mkdir()
    shutil.copy(ROOT / ".ci" / "run", tmp_path / ".ci" / "run")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    make = bin_dir / "make"
    make.write_text("#!/usr/bin/env bash\n" + make_script)
    make.chmod(0o755)
    return subprocess.run(["bash", str(tmp_path / ".ci" / "run")], capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", **env}, timeout=60)


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme
    assert "timeout --kill-after=30 \"${CI_TIMEOUT_S:-2700}\" make test" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("script,rc,message", [
    ('echo "$@"; exit 0', 0, None),
    ('echo "3 failed"; echo "make: *** [Makefile:23: test] Error 1" >&2; exit 2', 2, None),
    ('echo "no tests ran"; echo "make: *** [Makefile:23: test] Error 5" >&2; exit 2', 1, "collected no tests"),
    ("sleep 20", 1, "ran past 1 s"),
])
def test_ci_exit_status(tmp_path, script, rc, message):
    r = _ci(tmp_path, script, CI_TIMEOUT_S="1")
    assert r.returncode == rc, r.stderr
    if message:
        assert message in r.stderr
    if rc == 0:
        assert r.stdout.strip() == "test"  # exactly `make test`


def test_every_package_is_listed_for_the_wheel():
    """A subpackage missing from pyproject's ``packages`` works in an editable install and breaks a
    real one (``pip install .``): every folder with an ``__init__.py`` must be listed."""
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = {v: k for k, v in cfg["package-dir"].items()}
    found = set()
    for init in ROOT.glob("**/__init__.py"):
        rel = init.parent.relative_to(ROOT)
        top = rel.parts[0]
        if top not in dirs:
            continue
        found.add(".".join((dirs[top],) + rel.parts[1:]))
    assert found == set(cfg["packages"]), sorted(found ^ set(cfg["packages"]))
