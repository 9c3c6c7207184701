"""Measured convergence: how many steps a compressor needs to reach a loss.

Compression changes the number of optimizer steps a run needs, not only the time of
a step. The planner therefore ranks by ``iteration time x steps ratio``, where the
steps ratio of a method is ``steps(method reaches L) / steps(uncompressed reaches L)``
on loss curves measured by ``perfsim run`` with the same model, data, seed and
learning rate (``scripts/convergence_curves.py`` regenerates the bundled ones).

File format (JSON; bundled files are ``perfsim/data/convergence/<model>.json``)::

    {"model": "gpt2-tiny", "source": "perfsim run ...; 2026-11-23",
     "smoothing": 10,
     "pipeline": {"fp32": [[step, loss], ...], "aqsgd:fw3bw6": [[...]]},
     "gradient": {"none": [[step, loss], ...], "qsgd-maxnorm:4": [[...]]}}

``pipeline`` curves are pipeline-parallel runs without gradient compression,
``gradient`` curves data-parallel runs without pipeline compression. A combination
is assumed to multiply the two ratios (the errors of the two compressors enter
different tensors: activations and gradients) -- an assumption the plan prints.

The target loss defaults to the loss the uncompressed run reaches at half of its
measured budget, so a method may need up to twice the steps and still be ranked.
Losses are smoothed by a trailing mean of ``smoothing`` steps before comparison.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from perfsim.errors import ConfigError

_BUNDLED = Path(__file__).resolve().parent / "data" / "convergence"


def _smooth(curve: Sequence[Sequence[float]], window: int) -> list[tuple[int, float]]:
    out, acc = [], []
    for step, loss in curve:
        acc.append(float(loss))
        if len(acc) > window:
            acc.pop(0)
        out.append((int(step), sum(acc) / len(acc)))
    return out


def steps_to(curve: list[tuple[int, float]], target: float) -> int | None:
    """First step whose smoothed loss is <= ``target`` (None if never)."""
    for step, loss in curve:
        if loss <= target:
            return step
    return None


@dataclass(frozen=True)
class Convergence:
    """Loss curves of one model; :meth:`steps_ratio` answers the planner."""

    model: str
    source: str
    pipeline: Mapping[str, list[tuple[int, float]]]
    gradient: Mapping[str, list[tuple[int, float]]]
    path: str = ""

    def describe(self) -> str:
        return (f"measured curves of {self.model} ({self.path or 'bundled'}; {self.source}); "
                "pipeline x gradient ratios multiplied")

    def _ratio(self, curves: Mapping[str, list[tuple[int, float]]], ref: str, spec: str,
               target: float | None) -> float | None:
        if spec == ref:
            return 1.0
        if ref not in curves or spec not in curves:
            return None
        base = curves[ref]
        if target is None:
            target = base[len(base) // 2][1]
        s_ref, s = steps_to(base, target), steps_to(curves[spec], target)
        if s_ref is None:
            raise ConfigError(f"target loss {target}: the uncompressed run never reaches it")
        if s is None:
            return float("inf")
        return max(s, 1) / max(s_ref, 1)

    def reference_steps(self, target: float | None = None) -> int | None:
        """Optimizer steps uncompressed training needs to reach ``target`` (default:
        the loss its pipeline curve -- else its data-parallel curve -- reaches at half
        its budget)."""
        base = self.pipeline.get("fp32") or self.gradient.get("none")
        if not base:
            return None
        if target is None:
            target = base[len(base) // 2][1]
        return steps_to(base, target)

    def steps_ratio(self, compress: str, grad_compress: str, target: float | None = None) -> float | None:
        """Steps this (pipeline, gradient) compression needs relative to none, or None
        when a curve is missing; ``inf`` when it never reaches the target."""
        rp = self._ratio(self.pipeline, "fp32", compress, target)
        rg = self._ratio(self.gradient, "none", grad_compress, target)
        if rp is None or rg is None:
            return None
        return rp * rg


def parse_convergence(data: Mapping, where: str) -> Convergence:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: not a JSON object")
    unknown = set(data) - {"model", "source", "smoothing", "pipeline", "gradient"}
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}")
    window = data.get("smoothing", 10)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ConfigError(f"{where}: smoothing={window!r} must be an integer >= 1")
    tables = {}
    for part in ("pipeline", "gradient"):
        curves = data.get(part, {})
        if not isinstance(curves, Mapping):
            raise ConfigError(f"{where}: {part} must map a spec to [[step, loss], ...]")
        tables[part] = {}
        for spec, curve in curves.items():
            try:
                pts = [(int(s), float(l)) for s, l in curve]
            except (TypeError, ValueError):
                raise ConfigError(f"{where}: {part}.{spec}: need [[step, loss], ...]") from None
            if not pts:
                raise ConfigError(f"{where}: {part}.{spec}: empty curve")
            tables[part][str(spec)] = _smooth(pts, window)
    return Convergence(str(data.get("model", "")), str(data.get("source", "")), tables["pipeline"],
                       tables["gradient"], where)


def load_convergence(name: str | None, model: str) -> Convergence | None:
    """Curves from a file path, a bundled model name, or (``name=None``) the bundled
    curves of ``model`` if any."""
    if name is None:
        path = _BUNDLED / f"{model}.json"
        if not path.exists():
            return None
    else:
        path = Path(name)
        if not path.exists():
            path = _BUNDLED / f"{name}.json"
            if not path.exists():
                known = sorted(p.stem for p in _BUNDLED.glob("*.json"))
                raise ConfigError(f"convergence {name!r}: no such file or bundled model "
                                  f"(bundled: {', '.join(known) or 'none'})")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"convergence {str(path)!r}: cannot read ({exc})") from None
    return parse_convergence(data, str(path))
