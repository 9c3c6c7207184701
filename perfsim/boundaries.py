"""Per-boundary pipeline compression: a spec for each pipeline boundary.

``--compress SPEC`` compresses every pipeline boundary alike. On a heterogeneous
network the boundaries do not cost alike: an activation crossing a 200 Mbps
inter-region hop costs 50 times what it costs on a 10 Gbps link, so the plan puts
more bits on fast links and fewer on slow ones (the open question of AQ-SGD,
Wang et al., "Fine-tuning Language Models over Slow Networks using Activation
Compression with Guarantees", arXiv:2206.01299). ``--boundary-compress`` overrides
the spec of single boundaries::

    --compress fp16 --boundary-compress 1=aqsgd:fw3bw6
    --boundary-compress "0=fp16,1=aqsgd:fw2bw4,2=fp16"

Boundary ``k`` is the one after pipeline stage (model chunk) ``k``: the forward
activations stage ``k`` sends to stage ``k + 1`` and the gradients coming back.
Boundaries not named use ``--compress``. The text is one value (its commas separate
boundaries, not sweep alternatives); the same syntax is taken by ``perfsim predict``,
``perfsim sweep``, ``perfsim run`` and :func:`perfsim.predict`, and both the
simulator (:func:`perfsim.engine.plan.build_plan`) and the runtime
(:func:`perfsim.runtime.worker.make_stage_compressors`) read it through
:func:`spec_of`.
"""

from __future__ import annotations

from typing import Mapping

from perfsim.compression.spec import parse_spec
from perfsim.errors import ConfigError


def parse_boundary_compress(text: str | Mapping[int, str] | None) -> dict[int, str]:
    """``"1=aqsgd:fw3bw6,2=fp16"`` (or a mapping) -> ``{boundary: canonical spec}``.
    Raises ConfigError naming the culprit entry."""
    if text is None:
        return {}
    if isinstance(text, Mapping):
        items = [(k, v) for k, v in text.items()]
    else:
        raw = str(text).strip()
        if not raw:
            return {}
        items = []
        for entry in raw.split(","):
            entry = entry.strip()
            if "=" not in entry:
                raise ConfigError(f"boundary_compress {text!r}: entry {entry!r} is not BOUNDARY=SPEC "
                                  "(e.g. 1=aqsgd:fw3bw6)")
            items.append(tuple(part.strip() for part in entry.split("=", 1)))
    out: dict[int, str] = {}
    for key, spec in items:
        try:
            k = int(key)
        except (TypeError, ValueError):
            k = -1
        if isinstance(key, bool) or k < 0 or str(key).strip() != str(k):
            raise ConfigError(f"boundary_compress: boundary {key!r} must be an integer >= 0")
        if k in out:
            raise ConfigError(f"boundary_compress: boundary {k} given twice")
        out[k] = parse_spec(str(spec), "pipeline").text
    return dict(sorted(out.items()))


def format_boundary_compress(specs: Mapping[int, str]) -> str:
    """The canonical text of ``{boundary: spec}`` (``""`` when empty)."""
    return ",".join(f"{k}={v}" for k, v in sorted(specs.items()))


def canonical(text: str | Mapping[int, str] | None) -> str:
    """Canonical text of a per-boundary spec (checked)."""
    return format_boundary_compress(parse_boundary_compress(text))


def check_boundaries(text: str | Mapping[int, str] | None, num_stages: int) -> dict[int, str]:
    """Parse and check that every boundary named exists among ``num_stages`` stages."""
    specs = parse_boundary_compress(text)
    bad = [k for k in specs if k >= num_stages - 1]
    if bad:
        raise ConfigError(f"boundary_compress: boundary {bad[0]} does not exist ({num_stages} stages have "
                          f"boundaries 0..{num_stages - 2})" if num_stages > 1 else
                          f"boundary_compress: boundary {bad[0]} does not exist (one stage, no boundary)")
    return specs


def spec_of(compress: str, boundary_compress: str | Mapping[int, str] | None, boundary: int) -> str:
    """The pipeline spec of ``boundary``: its override, else ``compress``."""
    return parse_boundary_compress(boundary_compress).get(boundary, compress)
