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


def _function_level_imports(path: Path):
    """(line, text) of every import inside a function body of ``path`` (not under
    ``if TYPE_CHECKING``, not in a package ``__getattr__``)."""
    import ast

    src = path.read_text()
    lines, tree, out = src.splitlines(), ast.parse(src), []

    def visit(node, in_func):
        for ch in ast.iter_child_nodes(node):
            if isinstance(ch, ast.If) and "TYPE_CHECKING" in ast.unparse(ch.test):
                continue
            if isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if not (ch.name == "__getattr__" and path.name == "__init__.py" and node is tree):
                    visit(ch, True)
                continue
            if in_func and isinstance(ch, (ast.Import, ast.ImportFrom)):
                out.append((ch.lineno, lines[ch.lineno - 1], lines[ch.lineno - 2] if ch.lineno > 1 else ""))
            visit(ch, in_func)

    visit(tree, False)
    return out


def test_every_function_level_import_says_why_it_is_lazy():
    """Imports sit at module level unless they are heavy and optional (torch, pandas, ...) on a
    path the light commands must not pay for, or would close a cycle: each such import
    carries a ``# lazy: <reason>`` comment (on its line or the line above)."""
    unmarked = [f"{p.relative_to(ROOT)}:{n}: {text.strip()}"
                for p in sorted((ROOT / "perfsim").rglob("*.py"))
                for n, text, above in _function_level_imports(p)
                if "# lazy:" not in text and not above.strip().startswith("# lazy:")]
    assert not unmarked, "function-level imports without a '# lazy:' reason:\n" + "\n".join(unmarked)


def test_the_lazy_import_check_can_fail(tmp_path):
    (tmp_path / "m.py").write_text("import os\n\n\ndef f():\n    import json\n    import csv  # lazy: on use\n"
                                   "    # lazy: a cycle\n    from os import path\n    return json, csv, path\n")
    found = _function_level_imports(tmp_path / "m.py")
    assert [(n, "# lazy:" in t or a.strip().startswith("# lazy:")) for n, t, a in found] == \
        [(5, False), (6, True), (8, True)]
