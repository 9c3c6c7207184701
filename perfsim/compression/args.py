"""The argument schema of compressor specs: ``name:arg1:arg2`` parsed from a declaration.

A compressor class lists its arguments as :class:`SpecArg` values in
``Compressor.spec_args``; this module turns the ``:``-separated arguments of a
spec into typed, checked values (:func:`parse_args`), fills the defaults
(:func:`complete`), writes the canonical spec of a set of values
(:func:`format_spec`) and the syntax line ``perfsim compressors`` prints
(:func:`format_syntax`). Every mistake is one :class:`ConfigError` line naming
the argument (the registry prefixes the spec).

An argument takes one of three forms:

* positional (the default): ``directq:4``; positionals are matched in order,
  the optional ones (with a default) after the required ones;
* keyword (``key=True``): ``bucket=16``;
* word (``words={"det": False}``): a bare word that sets the value (``det``).

Each argument's ``name`` is the constructor parameter that receives its value
and the key of :meth:`Compressor.spec_values`. No torch here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from perfsim.errors import ConfigError


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


#: the default of an argument that must be given
REQUIRED: Any = _Required()


@dataclass(frozen=True)
class SpecArg:
    """One argument of a compressor spec (see the module docstring).

    ``type``: ``int``, ``float`` (finite), ``str`` (non-empty) or a parser
    ``text -> value`` that raises ConfigError. ``default``: a value, or a callable
    of the values of the arguments before it (``lambda v: v["bits"] + 4``), or
    :data:`REQUIRED`. ``choices`` / ``low`` / ``high`` (inclusive unless
    ``low_open`` / ``high_open``) check a value; ``note`` is appended to a range
    error. ``metavar`` names the value in the syntax line (``BITS``); ``fmt``
    writes a value back as spec text.
    """

    name: str
    type: Callable[[str], Any] = int
    default: Any = REQUIRED
    key: bool = False
    words: Mapping[str, Any] = field(default_factory=dict)
    choices: tuple = ()
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    note: str = ""
    metavar: str = ""
    fmt: Callable[[Any], str] | None = None

    @property
    def positional(self) -> bool:
        return not self.key and not self.words

    def default_for(self, values: Mapping[str, Any]) -> Any:
        """The default given the values of the arguments before this one."""
        return self.default(values) if callable(self.default) else self.default

    def text(self, value: Any) -> str:
        """``value`` as spec text: ``fmt``, floats as their shortest exact form."""
        if self.fmt is not None:
            return self.fmt(value)
        if isinstance(value, float):
            short = f"{value:g}"
            return short if float(short) == value else repr(value)
        return str(value)

    def convert(self, text: str) -> Any:
        """Parse the text of one argument (errors name it: ``bits 'x'``, ``option bucket='x'``)."""
        what = f"option {self.name}={text!r}" if self.key else f"{self.name} {text!r}"
        if self.type is int:
            try:
                return int(text)
            except ValueError:
                raise ConfigError(f"{what}: not an integer") from None
        if self.type is float:
            try:
                value = float(text)
            except ValueError:
                raise ConfigError(f"{what}: not a number") from None
            if not math.isfinite(value):
                raise ConfigError(f"{what}: not a finite number")
            return value
        if self.type is str:
            if not text:
                raise ConfigError(f"{what}: empty value")
            return text
        return self.type(text)

    def check(self, value: Any) -> None:
        """Raise a ConfigError naming the argument if ``value`` is out of its choices or range."""
        if value is None and self.default is None:
            return
        if self.choices and value not in self.choices:
            raise ConfigError(f"{self.name}={self.text(value)}: unsupported "
                              f"(choose from {', '.join(map(str, self.choices))})")
        lo_ok = self.low is None or (value > self.low if self.low_open else value >= self.low)
        hi_ok = self.high is None or (value < self.high if self.high_open else value <= self.high)
        if lo_ok and hi_ok:
            return
        if self.low is not None and self.high is not None:
            rng = (f"in {'(' if self.low_open else '['}{self.low:g}, "
                   f"{self.high:g}{')' if self.high_open else ']'}")
        elif self.low is not None:
            rng = f"{'>' if self.low_open else '>='} {self.low:g}"
        else:
            rng = f"{'<' if self.high_open else '<='} {self.high:g}"
        note = f" ({self.note})" if self.note else ""
        raise ConfigError(f"{self.name}={self.text(value)}: must be {rng}{note}")


def format_syntax(name: str, schema: Sequence[SpecArg]) -> str:
    """The syntax line of a spec: ``directq:BITS[:det][:bucket=N]``."""
    parts = [name]
    for a in schema:
        meta = a.metavar or a.name.upper()
        if a.positional:
            parts.append(f":{meta}" if a.default is REQUIRED else f"[:{meta}]")
        elif a.key:
            parts.append(f"[:{a.name}={meta}]")
        else:
            shown = [w for w, v in a.words.items() if v != a.default]
            parts.append(f"[:{'|'.join(shown)}]")
    return "".join(parts)


def parse_args(name: str, schema: Sequence[SpecArg], tokens: Sequence[str], *,
               syntax: str = "", example: str = "") -> dict[str, Any]:
    """Typed, checked values of the arguments given in ``tokens`` (``['4', 'det']``);
    arguments not given are absent (see :func:`complete`). ``syntax`` (default
    :func:`format_syntax`) and ``example`` go into the errors."""
    if tokens and not schema:
        raise ConfigError(f"{name} takes no arguments, got {':'.join(tokens)!r}")
    syntax = syntax or format_syntax(name, schema)
    expected = f"expected {syntax}" + (f", e.g. {example}" if example else "")
    keys = {a.name: a for a in schema if a.key}
    words = {w: a for a in schema for w in a.words}
    positional = [a for a in schema if a.positional]
    values: dict[str, Any] = {}
    given_pos = 0
    for tok in tokens:
        if "=" in tok:
            k, text = tok.split("=", 1)
            a = keys.get(k.strip().lower())
            if a is None:
                raise ConfigError(f"unknown option {k!r} ({expected})")
            values[a.name] = a.convert(text)
        elif tok.lower() in words:
            a = words[tok.lower()]
            values[a.name] = a.words[tok.lower()]
        elif given_pos < len(positional):
            a = positional[given_pos]
            given_pos += 1
            values[a.name] = a.convert(tok)
        else:
            raise ConfigError(f"unexpected argument {tok!r} ({expected})")
        a.check(values[a.name])
    missing = [a for a in positional[given_pos:] if a.default is REQUIRED]
    if missing:
        meta = ":".join(a.metavar or a.name.upper() for a in missing)
        raise ConfigError(f"missing {meta} ({expected})")
    return values


def complete(schema: Sequence[SpecArg], values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with the defaults of the arguments not given, in schema order,
    each value checked. Unknown names and missing required arguments are errors."""
    unknown = set(values) - {a.name for a in schema}
    if unknown:
        raise ConfigError(f"unknown argument(s) {sorted(unknown)} (known: "
                          f"{', '.join(a.name for a in schema) or 'none'})")
    out: dict[str, Any] = {}
    for a in schema:
        if a.name in values:
            out[a.name] = values[a.name]
        elif a.default is REQUIRED:
            raise ConfigError(f"missing argument {a.name}")
        else:
            out[a.name] = a.default_for(out)
        a.check(out[a.name])
    return out


def format_spec(name: str, schema: Sequence[SpecArg], values: Mapping[str, Any]) -> str:
    """The canonical spec of ``values`` (checked): positionals always (unless None),
    words and keywords only where the value differs from its default."""
    parts = [name]
    seen: dict[str, Any] = {}
    for a in schema:
        value = values[a.name]
        a.check(value)
        default = a.default_for(seen)
        seen[a.name] = value
        if a.positional:
            if value is not None:
                parts.append(a.text(value))
        elif value is not None and (a.default is REQUIRED or value != default):
            if a.key:
                parts.append(f"{a.name}={a.text(value)}")
            else:
                parts.append(next(w for w, v in a.words.items() if v == value))
    return ":".join(parts)
