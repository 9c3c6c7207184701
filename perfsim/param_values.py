"""A predict parameter's values: parsed once, at the edge, into their canonical form.

:func:`normalize` converts one value of a parameter of :data:`perfsim.param_table.PARAMS`
by its kind into SI (bits/s, seconds, bytes): ``"100Mbps"`` and ``1e8`` are the same
bandwidth; a compressor spec into :class:`~perfsim.compression.spec.Spec`, parsed once.
On it build the sweep grids (:func:`values_of`, :func:`grid`, :func:`expand`), every
parameter with its default (:func:`resolved`) and the table columns a parameter is
stored in (:func:`column`, :func:`shown_columns`, :func:`plain`). Errors are
:class:`~perfsim.errors.ConfigError` naming the parameter (its flag from the command line).
"""

from __future__ import annotations

import itertools
from typing import Any, Mapping, Sequence

from perfsim.boundaries import parse_boundary_compress
from perfsim.compression.spec import parse_spec
from perfsim.errors import ConfigError
from perfsim.job import PLACEMENT_DIMS
from perfsim.param_table import BY_NAME, NAMES, ONE_VALUE, PARAMS, Param, check_bound
from perfsim.tcp import parse_tcp_window
from perfsim.units import parse_bandwidth, parse_size, parse_time, split_list


def _param(name: str) -> Param:
    key = str(name).replace("-", "_")
    try:
        return BY_NAME[key]
    except KeyError:
        raise ConfigError(f"parameter {name!r}: unknown (known: {', '.join(NAMES)})") from None


def parse_bool(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{what}={value!r}: expected true or false")


def _parse_int(value: Any, p: Param, who: str) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{who}={value!r}: must be an integer")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{who}={value!r}: must be an integer") from None
    if not number.is_integer():
        raise ConfigError(f"{who}={value!r}: must be an integer")
    check_bound(p, int(number), who, value)  # the table's bound (Param.bound), as the config field's check
    return int(number)


def _parse_partition(value: Any, p: Param) -> tuple[int, ...] | str | None:
    from perfsim.partition import parse_counts  # lazy: import perfsim does not load perfsim.partition

    if isinstance(value, str) and value.strip().lower() == "uniform":
        return "uniform"
    counts = parse_counts(value)
    if counts is not None and not counts:
        raise ConfigError(f"partition={value!r}: empty")
    return counts


def parse_device_order(value: Any, who: str) -> tuple[int, ...] | None:
    try:
        items = str(value).split(",") if isinstance(value, str) else list(value)
        order = tuple(int(str(x).strip()) for x in items if str(x).strip())
    except (TypeError, ValueError):
        raise ConfigError(f"{who}={value!r}: expected comma-separated GPU indices") from None
    if sorted(order) != list(range(len(order))):
        raise ConfigError(f"{who}={value!r}: must be a permutation of 0..{len(order) - 1}")
    return order or None


#: the kinds whose canonical value is an immutable primitive or tuple: memoised by :func:`normalize`
_MEMO_KINDS = frozenset(("bandwidth", "time", "size", "window", "int", "float", "bool", "partition", "choice", "str"))
_normalized: dict[tuple, Any] = {}


def normalize(name: str, value: Any, cli: bool = False) -> Any:
    """One value of parameter ``name`` in canonical form: SI floats for rates
    and times, int bytes for sizes, ints, bools, stripped strings (lower-case
    for choices), a tuple for a partition; None stays None (the default).
    ``"1Gbps"`` and ``1e9`` normalise to the same value. Raises ConfigError
    naming the parameter (its flag with ``cli``). A primitive value of a kind whose canonical
    form is immutable is memoised (keyed on its type too: ``1`` and ``True`` differ): a planner
    resolves every parameter of every candidate."""
    p = _param(name)
    if value is None:
        return None
    if p.kind in _MEMO_KINDS and type(value) in (str, int, float, bool):
        key = (name, value, type(value), cli)
        if key not in _normalized:
            if len(_normalized) > 50_000:  # a long-lived process's many values: start afresh
                _normalized.clear()
            _normalized[key] = _normalize(p, value, cli)
        return _normalized[key]
    return _normalize(p, value, cli)


def _normalize(p: Param, value: Any, cli: bool) -> Any:
    """:func:`normalize` of a value that is not None."""
    kind, who = p.kind, p.flag if cli else p.name
    if kind == "bandwidth":  # a positive rate, as the table's bound (> 0)
        return parse_bandwidth(value, who)
    if kind == "time":  # >= 0, as the table's bound
        return parse_time(value, who, hint_unit=p.hint_unit)
    if kind == "size":
        size = parse_size(value, who, minimum=int(p.lower))
        check_bound(p, size, who)
        return size
    if kind == "window":  # auto, off or bytes (perfsim.tcp)
        return parse_tcp_window(value, who)
    if kind == "int":
        return _parse_int(value, p, who)
    if kind == "float":  # a finite number within the table's bound (Param.bound)
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{who}={value!r}: must be a number") from None
        check_bound(p, value if isinstance(value, bool) else number, who, value)
        return number
    if kind == "bool":
        return parse_bool(value, who)
    if kind == "partition":
        return _parse_partition(value, p)
    if kind == "boundaries":  # a BoundarySpecs value; prints (and is stored) as canonical text
        return parse_boundary_compress(value)
    if kind == "order":
        return parse_device_order(value, who)
    if kind == "placement":  # one rank order, its comma list one value: canonical text ``tp,dp,pp``
        dims = [str(x).strip().lower() for x in (value.split(",") if isinstance(value, str) else value)] \
            if isinstance(value, (str, list, tuple)) else None
        if dims is None or sorted(dims) != sorted(PLACEMENT_DIMS):
            raise ConfigError(f"{who}={value!r}: an order of tp, dp, pp (innermost first)")
        return ",".join(dims)
    if kind == "spec" and not isinstance(value, str):  # parsed already: kept, never parsed again
        return parse_spec(value, p.role) if hasattr(value, "role") else _bad_string(value, who)
    if hasattr(value, "__fspath__"):
        value = str(value)
    if kind == "profile" and not isinstance(value, str):
        from perfsim.profile import Profile  # lazy: import perfsim does not load perfsim.profile

        if not isinstance(value, Profile):
            raise ConfigError(f"{who}={value!r}: a profile file, a profile name or a loaded Profile")
    if kind in ("profile", "nic") and not isinstance(value, str):
        return value  # a loaded perfsim.profile.Profile, a perfsim.fabrics.Nic
    if not isinstance(value, str) or not value.strip():
        _bad_string(value, who)
    text = value.strip()
    if kind == "spec":  # parsed once into THE value (perfsim.compression.spec.Spec); prints as canonical text
        return parse_spec(text, p.role)
    if kind == "choice":
        text = text.lower()
        if text not in p.allowed:
            raise ConfigError(f"{who}={value!r}: choose from {', '.join(p.allowed)}")
    return text


def _bad_string(value: Any, who: str):
    raise ConfigError(f"{who}={value!r}: must be a non-empty string")


def assignments(items: Sequence[str], flag: str = "--set") -> dict[str, str]:
    """``NAME=VALUE`` texts (a script's repeated ``--set``) as ``{name: value}``, names with
    underscores, values as text for :func:`normalize`. A name given twice is refused (which value
    was meant? the last one won silently), as the command line refuses a flag given twice; so is
    an entry without ``=`` or a name. ConfigError naming ``flag`` and the entry."""
    out: dict[str, str] = {}
    for item in items:
        name, eq, value = str(item).partition("=")
        name = name.strip().replace("-", "_")
        if not eq or not name:
            raise ConfigError(f"{flag} {str(item)!r}: not NAME=VALUE")
        if name in out:
            raise ConfigError(f"{flag} {name} given twice ({name}={out[name]}, then {name}={value.strip()}); "
                              "give it once")
        out[name] = value.strip()
    return out


def plain(params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` with each spec value (a :class:`~perfsim.compression.spec.Spec`, a
    :class:`~perfsim.boundaries.BoundarySpecs`) as its canonical text: what tables and
    files store."""
    return {k: v.text if hasattr(v, "text") and not isinstance(v, str) else v for k, v in params.items()}


#: a table column's unit suffix by parameter kind (CSV columns carry units in their names)
_UNIT_SUFFIX = {"bandwidth": "_bps", "time": "_s", "size": "_bytes"}


def column(name: str) -> str:
    """The table column of parameter ``name``: its name with its unit (``bandwidth_bps``,
    ``latency_s``, ``bucket_size_bytes``, ``seq_len``), as the predict summary names it."""
    p = _param(name)
    return p.name + _UNIT_SUFFIX.get(p.kind, "")


def shown_columns(values: Mapping[str, Any], row: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters of ``values`` (one configuration) that the summary ``row`` of its result
    does not show, each as ``{column: value}`` (:func:`column`; specs as their text, a sequence
    as its comma list): without them the rows of a grid that differ only in ``seq_len`` or
    ``bucket_size`` cannot be told apart."""
    out = {}
    for name, value in plain(values).items():
        if name not in BY_NAME or value is None or name in row or column(name) in row:
            continue
        if isinstance(value, (list, tuple)):
            value = ",".join(map(str, value))
        elif not isinstance(value, (str, int, float, bool)):  # a loaded Profile: its file, else its kind
            value = str(getattr(value, "path", None) or f"<{type(value).__name__}>")
        out[column(name)] = value
    return out


def split_models(raw: str, what: str = "model") -> list[str]:
    """Comma list of models where an inline spec's own ``key=value`` items stay with it:
    ``gpt2-xl,gpt:layers=2,hidden=64`` -> two models (an empty element is refused,
    :func:`perfsim.units.split_list`)."""
    out: list[str] = []
    for item in split_list(raw, what):
        if out and "=" in item and ":" not in item:
            out[-1] += "," + item
        else:
            out.append(item)
    return out


def split_specs(raw: str, what: str = "spec") -> list[str]:
    """Comma list of compression specs where a spec's own comma list stays with it: the
    other scales of ``qsgd-maxnorm-multiscale:BITS:SCALES`` (its canonical text, as a CSV
    row or ``perfsim compressors`` writes it) -- ``none,qsgd-maxnorm-multiscale:4:6,8`` ->
    two specs. No compressor's name begins with a digit, so an element that does continues
    the spec before it (an empty element is refused, :func:`perfsim.units.split_list`)."""
    out: list[str] = []
    for item in split_list(raw, what):
        if out and item[:1].isdigit():
            out[-1] += "," + item
        else:
            out.append(item)
    return out


_SPLITTERS = {"model": split_models, "spec": split_specs}


def values_of(name: str, raw: Any, cli: bool = False) -> list:
    """A scalar, a comma-list string or a list -> de-duplicated normalised values
    (a partition string is one value; alternatives go in a list)."""
    p = _param(name)
    if p.kind in ONE_VALUE:  # one value, or a list of alternatives
        alternatives = isinstance(raw, list) and raw and not isinstance(raw[0], int)
        items = list(raw) if alternatives else [raw]
    else:
        items = list(raw) if isinstance(raw, (list, tuple)) else [raw]
    flat: list = []
    who = p.flag if cli else p.name
    for i, item in enumerate(items):
        splittable = isinstance(item, str) and p.kind not in ONE_VALUE
        if splittable and not item.strip() and len(items) > 1:  # ["10Gbps", ""]: never dropped
            raise ConfigError(f"{who} {raw!r}: element {i + 1} of {len(items)} is empty")
        flat.extend(_SPLITTERS.get(p.kind, split_list)(item, who) if splittable else [item])
    if not flat:
        raise ConfigError(f"{p.flag if cli else p.name}: empty list of values")
    out: list = []
    for item in flat:
        v = normalize(p.name, item, cli)
        if v not in out:
            out.append(v)
    return out


def grid(values: Mapping[str, Any], cli: bool = False) -> dict[str, list]:
    """``{name: value | list | comma list}`` -> ``{name: [normalised values]}`` in
    :data:`PARAMS` order, leaving out names whose value is None (``cli``: errors
    name the flag)."""
    given = {}
    for key, raw in values.items():
        if raw is not None:
            given[_param(key).name] = values_of(key, raw, cli)
    return {p.name: given[p.name] for p in PARAMS if p.name in given}


def expand(values: Mapping[str, list]) -> list[dict[str, Any]]:
    """The cartesian product of a :func:`grid` (the last parameter varies fastest)."""
    keys = list(values)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(values[k] for k in keys))]


def resolved(params: Mapping[str, Any]) -> dict[str, Any]:
    """Every parameter, normalised: ``params`` over :data:`DEFAULTS` (None = default)."""
    unknown = [k for k in params if str(k).replace("-", "_") not in BY_NAME]
    if unknown:
        raise ConfigError(f"unknown parameter(s) {sorted(unknown)} (known: {', '.join(NAMES)})")
    given = {str(k).replace("-", "_"): v for k, v in params.items() if v is not None}
    return {p.name: normalize(p.name, given.get(p.name, p.default)) for p in PARAMS}
