"""Compressor registry.

A compressor spec is ``name[:arg[:arg...]]``: ``fp16``, ``directq:4``,
``qsgd-maxnorm:4``, ``qsgd-maxnorm-multiscale:4:2``, ``randk-maxnorm:0.1:4``. The
grammar (and the pipeline form ``aqsgd:fw3bw6``) is :mod:`perfsim.compression.spec`;
each compressor class declares its arguments (``Compressor.spec_args``, parsed by
:mod:`perfsim.compression.args`); this module looks names up.
"""

from __future__ import annotations

import re
from typing import Callable

from perfsim.compression.base import Compressor
from perfsim.compression.spec import _FWBW, PIPELINE_EXAMPLES, Spec, parse_spec
from perfsim.errors import ConfigError

_REGISTRY: dict[str, type[Compressor]] = {}


def register(cls: type[Compressor]) -> type[Compressor]:
    """Class decorator: make ``cls`` available under ``cls.name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__}: set a class attribute `name` before registering")
    _REGISTRY[cls.name] = cls
    return cls


def _ensure_loaded() -> None:
    from perfsim.compression import load_builtins

    load_builtins()


def compressor_classes() -> dict[str, type[Compressor]]:
    """All registered compressor classes by name."""
    _ensure_loaded()
    return dict(_REGISTRY)


def make_compressor(spec: "str | Spec", **kwargs) -> Compressor:
    """Build a compressor from a spec such as ``directq:4``: a parsed :class:`Spec`
    (a gradient spec builds its :attr:`Spec.compressor`), or text, parsed here.

    ``kwargs`` (e.g. ``seed=``) go to the class's constructor (``Compressor.from_args``).
    Raises :class:`ConfigError` naming the spec when it is unknown or malformed.
    """
    _ensure_loaded()
    parsed = spec if isinstance(spec, Spec) else parse_spec(spec, "compressor")
    if parsed.role != "compressor":
        parsed = parsed.compressor
    spec = parsed.text
    name, args = parsed.name, list(parsed.args)
    cls = _REGISTRY.get(name)
    if cls is None:
        raise ConfigError(
            f"compressor {spec!r}: unknown (known: {', '.join(sorted(_REGISTRY))})")
    try:
        comp = cls.from_args(args, **kwargs)
    except ConfigError as exc:
        raise ConfigError(f"compressor {spec!r}: {exc}") from None
    return comp


def make_pipeline_pair(spec: "str | Spec", **kwargs) -> tuple[Compressor, Compressor]:
    """Build the (forward, backward) compressors of a pipeline spec (a parsed
    :class:`Spec`, or text, parsed here)."""
    parsed = spec if isinstance(spec, Spec) else parse_spec(spec, "pipeline")
    fw, bw = parsed.pipeline_pair()
    try:
        return make_compressor(fw, **kwargs), make_compressor(bw, **kwargs)
    except ConfigError as exc:
        raise ConfigError(f"pipeline compression {parsed.text!r}: {_pipeline_hint(str(exc), parsed)}") from None


def check_spec(spec: Spec) -> Spec:
    """``spec`` with its compressors' own arguments checked by building them once
    (the parser checks the grammar only): a pipeline spec's pair, a gradient spec's
    compressor; a 1-bit optimizer's options were checked by the parser. Raises
    ConfigError naming the spec."""
    if spec.role == "pipeline":
        make_pipeline_pair(spec)
    elif spec.family != "optimizer":
        make_compressor(spec)
    return spec


def _pipeline_hint(message: str, parsed: Spec) -> str:
    """A compressor's error restated for the fwXbwY pipeline spec it came from: its
    syntax with ``fwXbwY`` in place of the bits and, for its example, the pipeline
    example of that name (``aqsgd:3`` is no pipeline spec; ``aqsgd:fw3bw6`` is)."""
    if not any(_FWBW.fullmatch(a) for a in parsed.args):
        return message
    message = message.replace(f"expected {parsed.name}:BITS", f"expected {parsed.name}:fwXbwY")
    example = next((e for e in PIPELINE_EXAMPLES if e.split(":")[0] == parsed.name and _FWBW.search(e)), None)
    if example is not None:
        message = re.sub(r"e\.g\. [^\s)]+\)", f"e.g. {example})", message)
    return message


Factory = Callable[..., Compressor]
