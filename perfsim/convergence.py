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

A spec may also map to a list of curves, one per seed (``[[[step, loss], ...], ...]``;
seed ``i`` of a method is paired with seed ``i`` of the uncompressed run). With two or
more seeds a steps ratio carries a 95 % confidence interval (Student's t over the
per-seed ratios); a ratio whose interval includes 1 is treated as 1 -- the difference is
seed noise -- and the plan says so. With one seed a ratio has no interval, and the
plan says that too.

``pipeline`` curves are pipeline-parallel runs without gradient compression,
``gradient`` curves data-parallel runs without pipeline compression. A combination
is assumed to multiply the two ratios (the errors of the two compressors enter
different tensors: activations and gradients) -- an assumption the plan prints.

Curves from your own runs: ``plan --convergence`` also takes ``perfsim run`` output
folders (a comma list, or one folder holding them): each run's ``result.json`` gives its
job and its loss per step (:func:`convergence_from_runs`). A run that compresses the
gradients is a ``gradient`` curve, one that compresses the pipeline a ``pipeline`` curve,
an uncompressed run the reference of its part (``pipeline`` with ``pp > 1``, else
``gradient``); runs of one spec with several seeds are paired with the reference by seed.
The runs must be one job apart from the compressor (model, learning rate, optimizer,
micro- and macro-batch): comparing steps of different jobs would not be a steps ratio.
Published curves go in the JSON format above (``source`` names the paper and figure).

The target loss defaults to the loss the uncompressed run reaches at half of its
measured budget, so a method may need up to twice the steps and still be ranked.
Losses are smoothed by a trailing mean of ``smoothing`` steps before comparison.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, NamedTuple, Sequence

from perfsim.documents import load_json
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


def _never_reached(target: float, base: list[list[tuple[int, float]]]) -> None:
    """ConfigError: the uncompressed run (``base``, one smoothed curve per seed) never reaches
    ``target``, so no candidate has a time to loss; names the loss it does reach."""
    lowest = max(min(loss for _, loss in curve) for curve in base)  # every seed reaches this
    text = next(t for t in (f"{lowest:.{d}g}" for d in range(4, 18)) if float(t) >= lowest)  # a hint that works
    raise ConfigError(f"target loss {target}: the uncompressed run never reaches it (its lowest smoothed "
                      f"loss {text} in {max(step for step, _ in base[0])} measured steps); give a "
                      f"target >= {text}")


def steps_to(curve: list[tuple[int, float]], target: float) -> int | None:
    """First step whose smoothed loss is <= ``target`` (None if never)."""
    for step, loss in curve:
        if loss <= target:
            return step
    return None


#: two-sided 95 % quantiles of Student's t by degrees of freedom (1..10; beyond: 30 and
#: the normal 1.96 as the limit), from the standard t table
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


class Ratio(NamedTuple):
    """A steps ratio over ``n`` seeds: the mean and its 95 % interval (``lo == hi ==
    mean`` with one seed), and the value the plan uses (1 where the interval includes 1)."""

    mean: float
    lo: float
    hi: float
    n: int

    @property
    def includes_one(self) -> bool:
        return self.n >= 2 and self.lo <= 1.0 <= self.hi

    @property
    def used(self) -> float:
        return 1.0 if self.includes_one else self.mean


def interval(values: Sequence[float]) -> Ratio:
    """Mean of per-seed ratios with its 95 % Student-t interval."""
    n = len(values)
    mean = sum(values) / n
    if n < 2 or any(math.isinf(v) for v in values):
        return Ratio(mean, mean, mean, n)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = _T95.get(n - 1, 2.042 if n - 1 <= 30 else 1.96) * sd / math.sqrt(n)
    return Ratio(mean, mean - half, mean + half, n)


@dataclass(frozen=True)
class Convergence:
    """Loss curves of one model; :meth:`steps_ratio` answers the planner."""

    model: str
    source: str
    #: spec -> one smoothed curve per seed
    pipeline: Mapping[str, list[list[tuple[int, float]]]]
    gradient: Mapping[str, list[list[tuple[int, float]]]]
    path: str = ""

    def describe(self) -> str:
        seeds = min((len(c) for part in (self.pipeline, self.gradient) for c in part.values()), default=1)
        noise = (f"{seeds}+ seeds per curve, 95 % intervals; a ratio whose interval includes 1 is "
                 "treated as 1" if seeds >= 2 else "one seed per curve: the ratios carry no interval")
        return (f"measured curves of {self.model} ({self.path or 'bundled'}; {self.source}); "
                f"pipeline x gradient ratios multiplied; {noise}")

    def _target(self, base: list[list[tuple[int, float]]], target: float | None) -> float:
        return base[0][len(base[0]) // 2][1] if target is None else target

    def _ratio(self, curves: Mapping[str, list], ref: str, spec: str, target: float | None) -> Ratio | None:
        if spec == ref:
            return Ratio(1.0, 1.0, 1.0, len(curves.get(ref, [()])))
        if ref not in curves or spec not in curves:
            return None
        base = curves[ref]
        target = self._target(base, target)
        ratios = []
        for ref_curve, curve in zip(base, curves[spec]):  # seed i with seed i
            s_ref, s = steps_to(ref_curve, target), steps_to(curve, target)
            if s_ref is None:
                _never_reached(target, base)
            ratios.append(float("inf") if s is None else max(s, 1) / max(s_ref, 1))
        return interval(ratios)

    def reference_steps(self, target: float | None = None) -> int | None:
        """Optimizer steps uncompressed training needs to reach ``target`` (default:
        the loss its pipeline curve -- else its data-parallel curve -- reaches at half
        its budget); with several seeds the mean over them."""
        base = self.pipeline.get("fp32") or self.gradient.get("none")
        if not base:
            return None
        target = self._target(base, target)
        steps = [steps_to(c, target) for c in base]
        if any(s is None for s in steps):  # time to loss unknown for every candidate
            _never_reached(target, base)
        return round(sum(steps) / len(steps))

    def ratios(self, compress: str, grad_compress: str, target: float | None = None) -> tuple | None:
        """(pipeline :class:`Ratio`, gradient :class:`Ratio`), or None when a curve is missing.
        The specs (:class:`perfsim.compression.spec.Spec` or text) are looked up by their
        canonical text, which keys the curves files."""
        compress, grad_compress = str(compress), str(grad_compress)
        rp = self._ratio(self.pipeline, "fp32", compress, target)
        rg = self._ratio(self.gradient, "none", grad_compress, target)
        return None if rp is None or rg is None else (rp, rg)

    def steps_ratio(self, compress: str, grad_compress: str, target: float | None = None) -> float | None:
        """Steps this (pipeline, gradient) compression needs relative to none, or None
        when a curve is missing; ``inf`` when it never reaches the target. Each part is
        its mean over seeds, or 1 where its 95 % interval includes 1."""
        both = self.ratios(compress, grad_compress, target)
        return None if both is None else both[0].used * both[1].used


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
            seeds = curve if (isinstance(curve, list) and curve and isinstance(curve[0], list) and curve[0]
                              and isinstance(curve[0][0], list)) else [curve]
            tables[part][str(spec)] = []
            for one in seeds:
                try:
                    pts = [(int(s), float(l)) for s, l in one]
                except (TypeError, ValueError):
                    raise ConfigError(f"{where}: {part}.{spec}: need [[step, loss], ...] or a list of "
                                      "them (one per seed)") from None
                if not pts:
                    raise ConfigError(f"{where}: {part}.{spec}: empty curve")
                tables[part][str(spec)].append(_smooth(pts, window))
    return Convergence(str(data.get("model", "")), str(data.get("source", "")), tables["pipeline"],
                       tables["gradient"], where)


#: what the runs behind one set of curves must share (perfsim run's summary names)
SAME_JOB = ("model", "lr", "optimizer", "micro_batch", "macro_batch", "dataset_limit")


def _run_folders(name: str) -> list[Path] | None:
    """The ``perfsim run`` folders ``name`` names (a comma list of folders, or one folder
    holding them), or None when ``name`` names none."""
    parts = [Path(p) for p in name.split(",") if p]
    if len(parts) == 1 and parts[0].is_dir() and not (parts[0] / "result.json").exists():
        parts = sorted(p for p in parts[0].iterdir() if (p / "result.json").exists())
        return parts or None
    if len(parts) > 1 or (parts and parts[0].is_dir()):
        return parts
    return None


def convergence_from_runs(folders: Sequence[str | Path], smoothing: int = 10) -> Convergence:
    """Curves from ``perfsim run`` output folders (see the module docstring)."""
    runs = []
    for folder in map(Path, folders):
        try:
            data = json.loads((folder / "result.json").read_text())
            summary, losses = data["summary"], data.get("losses") or []
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ConfigError(f"convergence run {str(folder)!r}: not a perfsim run folder ({exc})") from None
        if not losses:
            raise ConfigError(f"convergence run {str(folder)!r}: no losses recorded")
        runs.append((folder, summary, [[int(d["step"]), float(d["loss"])] for d in losses]))
    if not runs:
        raise ConfigError("convergence: no perfsim run folders given")
    first_folder, first, _ = runs[0]
    for folder, summary, _ in runs[1:]:
        for key in SAME_JOB:  # a key an older run folder lacks is not compared
            if key in summary and key in first and summary[key] != first[key]:
                raise ConfigError(f"convergence run {str(folder)!r}: {key}={summary.get(key)!r} but "
                                  f"{str(first_folder)!r} has {first.get(key)!r} (curves must come from one job "
                                  "that differs only in its compressor)")
    tables: dict[str, dict[str, dict[int, list]]] = {"pipeline": {}, "gradient": {}}
    for folder, summary, curve in runs:
        comp, grad = str(summary.get("compress", "fp32")), str(summary.get("grad_compress", "none"))
        if grad != "none" and comp != "fp32":
            raise ConfigError(f"convergence run {str(folder)!r}: compresses both the pipeline ({comp}) and the "
                              f"gradients ({grad}); give runs that compress one (the plan multiplies the parts)")
        if grad != "none":
            part, spec = "gradient", grad
        elif comp != "fp32":
            part, spec = "pipeline", comp
        else:
            part, spec = ("pipeline", "fp32") if int(summary.get("pp", 1)) > 1 else ("gradient", "none")
        seed = int(summary.get("seed", 0))
        if seed in tables[part].setdefault(spec, {}):
            raise ConfigError(f"convergence run {str(folder)!r}: a second {part} run of {spec} with seed {seed}")
        tables[part][spec][seed] = curve
    data: dict = {"model": str(first.get("model", "")), "smoothing": smoothing}
    for part, ref in (("pipeline", "fp32"), ("gradient", "none")):
        seeds = sorted(tables[part].get(ref, {}))
        for spec, by_seed in tables[part].items():
            if seeds and sorted(by_seed) != seeds:
                raise ConfigError(f"convergence runs: {part} {spec} has seeds {sorted(by_seed)}, its uncompressed "
                                  f"reference {ref} has {seeds} (seed i is compared with seed i)")
        data[part] = {spec: [by_seed[s] for s in sorted(by_seed)] for spec, by_seed in tables[part].items()}
    data["source"] = f"perfsim run folders: {', '.join(str(f) for f, _, _ in runs)}"
    return parse_convergence(data, ",".join(str(f) for f, _, _ in runs))


def load_convergence(name: str | None, model: str) -> Convergence | None:
    """Curves from a file path, ``perfsim run`` folders, a bundled model name, or
    (``name=None``) the bundled curves of ``model`` if any."""
    if name is not None:
        if not isinstance(name, (str, os.PathLike)):
            raise ConfigError(f"convergence={name!r}: a bundled model name, a JSON file or perfsim run folders")
        name = os.fspath(name)
    if name is not None and (folders := _run_folders(name)) is not None:
        return convergence_from_runs(folders)
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
        data = load_json(path.read_text(), f"convergence {str(path)!r}")
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"convergence {str(path)!r}: cannot read ({exc})") from None
    return parse_convergence(data, str(path))
