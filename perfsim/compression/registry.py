"""Compressor registry and spec parsing.

A *spec* is ``name[:arg[:arg...]]``: ``fp16``, ``directq:4``, ``qsgd-maxnorm:4``,
``qsgd-maxnorm-multiscale:4:2``, ``randk-maxnorm:0.1:4``. Each compressor class
parses its own args in ``from_args``; this module only looks names up.

A *pipeline* spec names the pair used across a pipeline boundary: forward
activations and backward activation-gradients, e.g. ``fp32``,
``directq:fw4bw8``, ``aqsgd:fw3bw6``, ``aqsgd:fw2bw4:m8`` (8-bit message buffers).
AQ-SGD compresses the forward activations by their change; the backward
gradients are directly quantized (aq-sgd-paper.txt, Sec. 3 and App. H.5).
"""

from __future__ import annotations

import re
from typing import Callable

from perfsim.compression.base import Compressor
from perfsim.errors import ConfigError

_REGISTRY: dict[str, type[Compressor]] = {}


def register(cls: type[Compressor]) -> type[Compressor]:
    """Class decorator: make ``cls`` available under ``cls.name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__}: set a class attribute `name` before registering")
    _REGISTRY[cls.name] = cls
    return cls


def _ensure_loaded() -> None:
    # Importing the package registers every built-in compressor.
    import perfsim.compression  # noqa: F401


def compressor_classes() -> dict[str, type[Compressor]]:
    """All registered compressor classes by name."""
    _ensure_loaded()
    return dict(_REGISTRY)


def make_compressor(spec: str, **kwargs) -> Compressor:
    """Build a compressor from a spec such as ``directq:4``.

    ``kwargs`` (e.g. ``seed=``) go to the class's ``from_args``.
    Raises :class:`ConfigError` naming the spec when it is unknown or malformed.
    """
    _ensure_loaded()
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"compressor spec {spec!r}: empty")
    name, *args = spec.strip().split(":")
    name = name.lower()
    aliases = {"none": "fp32", "fp32": "fp32"}
    name = aliases.get(name, name)
    cls = _REGISTRY.get(name)
    if cls is None:
        raise ConfigError(
            f"compressor {spec!r}: unknown (known: {', '.join(sorted(_REGISTRY))})")
    try:
        comp = cls.from_args(args, **kwargs)
    except ConfigError as exc:
        raise ConfigError(f"compressor {spec!r}: {exc}") from None
    return comp


def parse_bits(text: str, allowed: tuple[int, ...], what: str = "bits") -> int:
    """Parse a bit width and check it against ``allowed``."""
    try:
        bits = int(text)
    except (TypeError, ValueError):
        raise ConfigError(f"{what} {text!r}: not an integer") from None
    if bits not in allowed:
        raise ConfigError(f"{what}={bits}: unsupported (choose from {', '.join(map(str, allowed))})")
    return bits


_FWBW = re.compile(r"fw(\d+)bw(\d+)", re.IGNORECASE)


def parse_pipeline_spec(spec: str) -> tuple[str, str]:
    """Split a pipeline compression spec into (forward spec, backward spec).

    ``fp32`` -> (``fp32``, ``fp32``); ``directq:fw4bw8`` -> (``directq:4``,
    ``directq:8``); ``aqsgd:fw3bw6:m8`` -> (``aqsgd:3:m8``, ``directq:6``).
    A spec without ``fwXbwY`` uses the same compressor both ways.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"pipeline compression {spec!r}: empty")
    name, *args = spec.strip().split(":")
    name = name.lower()
    fwbw = [a for a in args if _FWBW.fullmatch(a)]
    rest = [a for a in args if not _FWBW.fullmatch(a)]
    if not fwbw:
        if name == "aqsgd":
            raise ConfigError(f"pipeline compression {spec!r}: aqsgd needs fwXbwY, e.g. aqsgd:fw3bw6")
        return spec, spec
    if len(fwbw) > 1:
        raise ConfigError(f"pipeline compression {spec!r}: more than one fwXbwY")
    fw_bits, bw_bits = _FWBW.fullmatch(fwbw[0]).groups()
    fw = ":".join([name, fw_bits, *rest])
    if name == "aqsgd":
        bw = f"directq:{bw_bits}"
    else:
        bw = ":".join([name, bw_bits, *rest])
    return fw, bw


def make_pipeline_pair(spec: str, **kwargs) -> tuple[Compressor, Compressor]:
    """Build the (forward, backward) compressors of a pipeline spec."""
    fw, bw = parse_pipeline_spec(spec)
    try:
        return make_compressor(fw, **kwargs), make_compressor(bw, **kwargs)
    except ConfigError as exc:
        raise ConfigError(f"pipeline compression {spec!r}: {exc}") from None


Factory = Callable[..., Compressor]
