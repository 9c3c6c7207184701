"""perfsim/__init__.pyi: the API front as IDEs and type checkers see it (issue 38), generated
by scripts/gen_stubs.py from perfsim.params.PARAMS; it must be current."""

import ast
import importlib.util
from pathlib import Path

import perfsim
from perfsim import params

ROOT = Path(__file__).resolve().parents[2]
STUB = ROOT / "perfsim" / "__init__.pyi"


def _gen():
    spec = importlib.util.spec_from_file_location("gen_stubs", ROOT / "scripts" / "gen_stubs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _functions() -> dict[str, ast.FunctionDef]:
    tree = ast.parse(STUB.read_text())
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def test_stub_is_current():
    """Regenerating the stub gives the same text (else: python scripts/gen_stubs.py)."""
    assert _gen().render() == STUB.read_text(), "perfsim/__init__.pyi is stale: run python scripts/gen_stubs.py"


def test_predict_keywords_types_and_defaults_are_params():
    fn = _functions()["predict"]
    assert not fn.args.args and fn.args.kwarg is None  # keyword-only, no **params left for tools to guess
    got = {a.arg: (ast.unparse(a.annotation), None if d is None else ast.literal_eval(d))
           for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults)}
    want = {p.name: (p.annotation, p.default) for p in params.PARAMS}
    want["trace"] = ("bool", False)
    assert got == want
    assert ast.unparse(fn.returns) == "Result"
    assert "bandwidth (str | float, default '10Gbps')" in ast.get_docstring(fn)


def test_every_public_name_is_in_the_stub():
    funcs = _functions()
    for name in perfsim.__all__:
        if name not in ("__version__", "ConfigError"):
            assert name in funcs, name
    sweep = {a.arg for a in funcs["sweep"].args.kwonlyargs}
    assert {p.name for p in params.PARAMS} <= sweep and {"out", "jobs", "skip_invalid"} <= sweep
    assert [a.arg for a in funcs["memory_report"].args.kwonlyargs] == list(params.NAMES)


def test_a_changed_parameter_makes_the_stub_stale(monkeypatch):
    """The currency check can fail: a new default in predict's signature (PARAMS) changes the stub."""
    import inspect

    gen = _gen()
    monkeypatch.setattr(perfsim.predict, "__signature__", inspect.Signature(
        [q.replace(default=16) if q.name == "pp" else q for q in inspect.signature(perfsim.predict).parameters.values()]))
    text = gen.render()
    assert text != STUB.read_text() and "pp: int = 16" in text
