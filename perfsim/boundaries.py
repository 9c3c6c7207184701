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
(:func:`perfsim.runtime.worker.make_stage_compressors`) hold it parsed once, as a
:class:`BoundarySpecs` of :class:`perfsim.compression.spec.Spec` values
(``boundary_compress.get(k, compress)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Mapping

from perfsim.compression.spec import Spec, parse_spec
from perfsim.errors import ConfigError


@dataclass(frozen=True)
class BoundarySpecs:
    """The per-boundary overrides as a value: ``{boundary: pipeline Spec}``, sorted,
    immutable and hashable (held by ``Strategy.boundary_compress`` and
    ``RunConfig.boundary_compress``). Prints as its canonical text
    (``1=aqsgd:fw3bw6,2=fp16``; ``""`` when empty), which outputs and sweep keys store."""

    #: ``((boundary, Spec), ...)`` sorted by boundary
    specs: tuple[tuple[int, Spec], ...] = ()

    def get(self, boundary: int, default: Spec | None = None) -> Spec | None:
        """The spec of ``boundary``: its override, else ``default``."""
        return dict(self.specs).get(boundary, default)

    def items(self) -> list[tuple[int, Spec]]:
        return list(self.specs)

    def values(self) -> list[Spec]:
        return [spec for _, spec in self.specs]

    def __iter__(self) -> Iterator[int]:
        return iter(k for k, _ in self.specs)

    def __len__(self) -> int:
        return len(self.specs)

    @property
    def text(self) -> str:
        """The canonical text (``""`` when empty)."""
        return ",".join(f"{k}={v.text}" for k, v in self.specs)

    def __str__(self) -> str:
        return self.text


def parse_boundary_compress(text: "str | Mapping[int, str | Spec] | BoundarySpecs | None") -> BoundarySpecs:
    """``"1=aqsgd:fw3bw6,2=fp16"`` (or a mapping) -> :class:`BoundarySpecs`, each spec
    parsed once (a BoundarySpecs passes through). Raises ConfigError naming the culprit entry."""
    if isinstance(text, BoundarySpecs):
        return text
    if text is None:
        return BoundarySpecs()
    if isinstance(text, Mapping):
        items = [(k, v) for k, v in text.items()]
    else:
        raw = str(text).strip()
        if not raw:
            return BoundarySpecs()
        items = []
        for entry in raw.split(","):
            entry = entry.strip()
            if "=" not in entry:
                raise ConfigError(f"boundary_compress {text!r}: entry {entry!r} is not BOUNDARY=SPEC "
                                  "(e.g. 1=aqsgd:fw3bw6)")
            items.append(tuple(part.strip() for part in entry.split("=", 1)))
    out: dict[int, Spec] = {}
    for key, spec in items:
        try:
            k = int(key)
        except (TypeError, ValueError):
            k = -1
        if isinstance(key, bool) or k < 0 or str(key).strip() != str(k):
            raise ConfigError(f"boundary_compress: boundary {key!r} must be an integer >= 0")
        if k in out:
            raise ConfigError(f"boundary_compress: boundary {k} given twice")
        out[k] = parse_spec(spec if isinstance(spec, Spec) else str(spec), "pipeline")
    return BoundarySpecs(tuple(sorted(out.items())))


def check_boundaries(specs: BoundarySpecs, num_stages: int) -> BoundarySpecs:
    """Check that every boundary named exists among ``num_stages`` stages."""
    bad = [k for k in specs if k >= num_stages - 1]
    if bad:
        raise ConfigError(f"boundary_compress: boundary {bad[0]} does not exist ({num_stages} stages have "
                          f"boundaries 0..{num_stages - 2})" if num_stages > 1 else
                          f"boundary_compress: boundary {bad[0]} does not exist (one stage, no boundary)")
    return specs
