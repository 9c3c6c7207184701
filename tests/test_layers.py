"""The layering of docs/architecture.md, enforced over every import (lazy ones included).

The contracts live in pyproject.toml ([tool.importlinter]); import-linter's ``lint-imports``
checks them against the import graph grimp builds of the package.
"""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _lint(config: Path | None = None) -> subprocess.CompletedProcess:
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    args = [exe, "--no-cache"] + (["--config", str(config)] if config else [])
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_every_layering_contract_is_kept():
    r = _lint()
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-1000:]
    assert "0 broken" in r.stdout


def test_a_forbidden_import_breaks_the_contract(tmp_path):
    """The check can fail: a contract the package breaks (the engine must not import the
    network layer above the models -- it does) is reported."""
    cfg = tmp_path / "contracts.toml"
    cfg.write_text('[tool.importlinter]\nroot_package = "perfsim"\n\n[[tool.importlinter.contracts]]\n'
                   'name = "probe"\ntype = "forbidden"\nsource_modules = ["perfsim.engine"]\n'
                   'forbidden_modules = ["perfsim.network"]\n')
    r = _lint(cfg)
    assert r.returncode != 0 and "BROKEN" in r.stdout.upper()
