"""The catalogue of accepted compression specs: one row per (role, spec) with its
syntax and exact wire size for one tensor shape -- alone (``wire_bytes``: one
payload) and in data parallel (``dp_bytes``: what each of ``world_size`` ranks
feeds to the collectives of one gradient exchange, the sum of the compressor's
``dp_plan``, the number the simulator charges).

``grad`` rows are ``--grad-compress`` values: every registered compressor
(``name``), built from a representative spec (its ``example_spec`` class
attribute; failing that, its bare name, then its ``spec_syntax`` with the usual
placeholders filled in), and the 1-bit optimizers; ``pipeline`` rows are
``--compress`` values (:data:`perfsim.compression.spec.PIPELINE_EXAMPLES`; sizes
of the forward direction). Each ``spec`` is the canonical text
(:class:`perfsim.compression.spec.Spec`); sizes are asked from the compressor
objects, never computed here. Columns: :data:`COLUMNS` (ratios relative to the
fp32 bytes). ``perfsim.compressors()`` returns these rows as a DataFrame and
``perfsim compressors`` formats them.
"""

from __future__ import annotations

import math
import re

from perfsim.compression import compressor_classes, make_compressor, make_pipeline_pair, spec as _spec
from perfsim.compression.refresh import BOUNDS
from perfsim.compression.spec import EXCHANGES, OPTIMIZERS, PIPELINE_ONLY, parse_spec
from perfsim.errors import ConfigError

COLUMNS = ("role", "name", "family", "spec", "label", "syntax", "allreduce_compatible",
           "wire_bytes", "ratio", "dp_bytes", "dp_ratio")

#: placeholder -> value used when a class gives no example_spec
_PLACEHOLDERS = {"BITS": "4", "FRACTION": "0.01", "RANK": "4", "LEVELS": "7", "K": "0.01",
                 "FWBITS": "4", "BWBITS": "8"}


def _candidate_specs(cls) -> list[str]:
    out = []
    if cls.example_spec:
        out.append(cls.example_spec)
    out.append(cls.name)
    syntax = re.sub(r"\[[^\]]*\]", "", cls.spec_syntax)  # drop optional parts
    syntax = syntax.split("|")[0].strip()  # first of several alternatives
    if syntax:
        filled = syntax
        for key, val in _PLACEHOLDERS.items():
            filled = re.sub(rf"\b{key}\b", val, filled)
        out.append(filled)
    return list(dict.fromkeys(out))


def build_example(cls):
    """A compressor instance of ``cls`` from its representative spec (None if none builds)."""
    for text in _candidate_specs(cls):
        try:
            comp = make_compressor(text)
        except ConfigError:
            continue
        if isinstance(comp, cls):
            return comp
    return None


def _row(role: str, text, syntax: str, comp, shape, fp32: int, world_size: int) -> dict:
    parsed = parse_spec(text, role)
    row = {"role": role, "name": comp.name if comp is not None and parsed.family != "optimizer"
           else parsed.name, "family": parsed.family, "spec": parsed.text,
           "label": parsed.label, "syntax": syntax,
           "allreduce_compatible": None if comp is None else bool(comp.allreduce_compatible),
           "wire_bytes": None, "ratio": None, "dp_bytes": None, "dp_ratio": None}
    if comp is not None:
        try:
            wb = int(comp.wire_bytes(shape))
        except ConfigError:  # this compressor cannot take that shape: n/a, keep the others
            return row
        row.update(wire_bytes=wb, ratio=wb / fp32)
        try:
            dp = int(sum(s.nbytes for s in comp.dp_plan(shape, world_size)))
            row.update(dp_bytes=dp, dp_ratio=dp / fp32)
        except ConfigError:
            pass
    return row


def _pipeline_syntax(cls) -> str:
    syntax = cls.spec_syntax or cls.name
    return syntax.replace(f"{cls.name}:BITS", f"{cls.name}:fwBITSbwBITS", 1)


def rows(shape: tuple[int, ...], world_size: int = 2) -> list[dict]:
    """One dict per accepted spec, columns :data:`COLUMNS`: gradient rows first."""
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ConfigError(f"--world-size {world_size!r}: must be an integer >= 1")
    fp32 = 4 * math.prod(shape)
    classes = compressor_classes()
    out = [_row("grad", "none", "none", make_compressor("fp32"), shape, fp32, world_size)]
    for name, cls in sorted(classes.items()):
        if name == "fp32" or name in PIPELINE_ONLY:
            continue
        comp = build_example(cls)
        text = comp.spec or name if comp is not None else name
        out.append(_row("grad", text, cls.spec_syntax, comp, shape, fp32, world_size))
    for name in OPTIMIZERS:  # the 1-bit optimizers exchange momentum with the onebit compressor
        syntax = (f"{name}[:warmup=STEPS][:exchange={'|'.join(EXCHANGES)}][:refresh=K]"
                  f"[:bound={'|'.join(BOUNDS)}]")
        out.append(_row("grad", name, syntax, make_compressor("onebit"), shape, fp32, world_size))
    for text in _spec.PIPELINE_EXAMPLES:
        spec = parse_spec(text, "pipeline")  # read once; the pair and the row take the value
        fw, _ = make_pipeline_pair(spec)
        out.append(_row("pipeline", spec, _pipeline_syntax(classes[spec.name]), fw, shape, fp32, world_size))
    return out
