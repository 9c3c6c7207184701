"""Write ``perfsim/__init__.pyi``: the API front's functions with their keywords, types
and defaults, for IDEs and type checkers (issue 38).

``perfsim.predict``, ``perfsim.sweep`` and ``perfsim.memory_report`` take ``**params``
at run time and get their signatures from :data:`perfsim.params.PARAMS`
(:func:`perfsim.params.signature`), which static tools cannot see; the stub spells
them out; predict's docstring (the parameter table, built at run time) is copied
whole, the others' first paragraph.
The other functions' signatures are read the same way, from the objects
``import perfsim`` builds, so the stub is what ``inspect.signature`` says.

    python scripts/gen_stubs.py            # rewrite perfsim/__init__.pyi
    python scripts/gen_stubs.py --check    # exit 1 when the file is not current

``tests/test_stubs.py`` checks that the shipped stub is current. Rerun after changing
PARAMS or a front function's signature.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STUB = ROOT / "perfsim" / "__init__.pyi"
sys.path.insert(0, str(ROOT))  # this checkout's perfsim

#: the names the annotations use, and where they come from
IMPORTS = """\
import os
from typing import Any, Callable, Mapping, Sequence

from pandas import DataFrame

from perfsim.analysis.memory_fit import MemoryReport
from perfsim.analysis.sweep import SweepTable
from perfsim.boundaries import BoundarySpecs
from perfsim.compression.spec import Spec
from perfsim.errors import ConfigError as ConfigError
from perfsim.fabrics import Nic
from perfsim.plan import PlanResult
from perfsim.profile import Profile
from perfsim.result import Result
from perfsim.search_space import SearchSpace
"""

#: return types of the functions whose run-time signature leaves them out
RETURNS = {"validate": "DataFrame", "calibrate": "Profile", "compressors": "DataFrame"}


def _default(value) -> str:
    """A default as the stub writes it: the value where it is a literal, else ``...``."""
    if isinstance(value, (bool, int, float, str, type(None))):
        return repr(value)
    if isinstance(value, tuple) and all(isinstance(v, (bool, int, float, str, type(None))) for v in value):
        return repr(value)
    return "..."


def _members(text: str) -> list[str]:
    """The top-level members of a union written as text (``Callable[[int], None] | None``: two)."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch in "[(" and 1 or ch in "])" and -1 or 0
        if ch == "|" and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
    out.append(text[start:].strip())
    return out


def _annotation(a, default=inspect.Parameter.empty) -> str:
    """An annotation as stub text: each union member once; ``| None`` where the default is None,
    ``str |`` where it is text."""
    if a is inspect.Parameter.empty:
        return "Any"
    members = list(dict.fromkeys(_members(a.strip("'\"") if isinstance(a, str) else inspect.formatannotation(a))))
    if default is None and "None" not in members and "Any" not in members:
        members.append("None")
    if isinstance(default, str) and "str" not in members and "Any" not in members:
        members.insert(0, "str")  # a flag's text default (run's compress="fp32" fills a Spec field)
    if "None" in members:  # None last, as the rest of the stub writes it
        members = [m for m in members if m != "None"] + ["None"]
    return " | ".join(members)


def _function(name: str, func) -> str:
    sig = inspect.signature(func)
    parts: list[str] = []
    star = False
    for p in sig.parameters.values():
        if p.kind == p.VAR_KEYWORD:
            parts.append(f"**{p.name}: {_annotation(p.annotation)}")
            continue
        if p.kind == p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        text = f"{p.name}: {_annotation(p.annotation, p.default)}"
        if p.default is not inspect.Parameter.empty:
            text += f" = {_default(p.default)}"
        parts.append(text)
    ret = RETURNS.get(name) or _annotation(sig.return_annotation)
    head = f"def {name}(\n" + "".join(f"    {p},\n" for p in parts) + f") -> {ret}:"
    doc = inspect.cleandoc(func.__doc__ or "").replace('"""', "'''").replace("\\", "\\\\")
    if name != "predict":  # its first paragraph; the whole text is the function's own (help(perfsim.X))
        doc = doc.split("\n\n")[0] + f"\n\nThe whole text: ``help(perfsim.{name})``."
    if not doc:
        return head + " ...\n"
    body = "\n".join(f"    {ln}" if ln else "" for ln in doc.splitlines())
    return f'{head}\n    """{body.lstrip()}\n    """\n    ...\n'


def render() -> str:
    """The text of ``perfsim/__init__.pyi`` for the perfsim imported here."""
    import perfsim

    funcs = [n for n in perfsim.__all__ if n not in ("__version__", "ConfigError")]
    out = ['"""Type stub of the API front (generated by scripts/gen_stubs.py from perfsim.params.PARAMS',
           'and the front\'s signatures; do not edit: rerun the script)."""', "", IMPORTS, "",
           "__version__: str", "",
           f"__all__ = {perfsim.__all__!r}", ""]
    for name in funcs:
        out += ["", _function(name, getattr(perfsim, name))]
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--check", action="store_true", help="exit 1 when the stub is not current")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        current = STUB.read_text() if STUB.exists() else ""
        if current != text:
            print(f"{STUB.relative_to(ROOT)}: not current; run python scripts/gen_stubs.py", file=sys.stderr)
            return 1
        print(f"{STUB.relative_to(ROOT)}: current")
        return 0
    from perfsim.outputs import write_text

    write_text(STUB, text)
    print(f"wrote {STUB.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
