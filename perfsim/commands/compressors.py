"""``perfsim compressors``: every registered compressor, its spec syntax and its
exact wire size for one tensor shape -- alone (``wire_bytes``: one payload) and
in data parallel (``dp_bytes``: what each of ``--world-size`` ranks feeds to the
collectives of one gradient exchange, the sum of the compressor's ``dp_plan``,
the number the simulator charges and ``perfsim.ddp``'s ``wire_bytes`` counts).

Each class is built from a representative spec (its ``example_spec`` class
attribute; failing that, its bare name, then its ``spec_syntax`` with the usual
placeholders filled in) and asked for ``wire_bytes(shape)`` -- sizes are never
computed here. CSV columns: ``name,spec,allreduce_compatible,wire_bytes,ratio,dp_bytes,dp_ratio``
(ratios relative to the fp32 bytes; ``dp_ratio`` to a plain fp32 allreduce input).
"""

from __future__ import annotations

import re

HELP = "list every compressor with its spec syntax, allreduce compatibility and exact wire bytes"

DEFAULT_SHAPE = "1,1024,1600"
COLUMNS = ("name", "spec", "allreduce_compatible", "wire_bytes", "ratio", "dp_bytes", "dp_ratio")

#: placeholder -> value used when a class gives no example_spec
_PLACEHOLDERS = {"BITS": "4", "FRACTION": "0.01", "RANK": "4", "LEVELS": "7", "K": "0.01",
                 "FWBITS": "4", "BWBITS": "8"}


def add_arguments(parser) -> None:
    parser.add_argument("--shape", default=DEFAULT_SHAPE,
                        help=f"tensor shape, comma-separated (default {DEFAULT_SHAPE}: one GPT2-1.5B "
                             "boundary activation)")
    parser.add_argument("--format", choices=("table", "csv"), default="table", help="output format")
    parser.add_argument("--world-size", type=int, default=2, metavar="W",
                        help="data-parallel ranks for the dp_bytes column (default 2)")


def parse_shape(text: str) -> tuple[int, ...]:
    """``'1,1024,1600'`` -> ``(1, 1024, 1600)``; ConfigError naming --shape otherwise."""
    from perfsim.errors import ConfigError

    parts = [p.strip() for p in str(text).replace("x", ",").split(",")]
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        raise ConfigError(f"--shape {text!r}: expected positive integers separated by commas, "
                          "e.g. 1,1024,1600") from None
    if not shape or any(d <= 0 for d in shape):
        raise ConfigError(f"--shape {text!r}: every dimension must be a positive integer")
    return shape


def _candidate_specs(cls) -> list[str]:
    out = []
    example = getattr(cls, "example_spec", None)
    if example:
        out.append(example)
    out.append(cls.name)
    syntax = re.sub(r"\[[^\]]*\]", "", getattr(cls, "spec_syntax", "") or "")  # drop optional parts
    syntax = syntax.split("|")[0].strip()  # first of several alternatives
    if syntax:
        filled = syntax
        for key, val in _PLACEHOLDERS.items():
            filled = re.sub(rf"\b{key}\b", val, filled)
        out.append(filled)
    return list(dict.fromkeys(out))


def build_example(cls):
    """A compressor instance of ``cls`` from its representative spec (None if none builds)."""
    from perfsim.compression import make_compressor
    from perfsim.errors import ConfigError

    for spec in _candidate_specs(cls):
        try:
            comp = make_compressor(spec)
        except ConfigError:
            continue
        if isinstance(comp, cls):
            return comp
    return None


from perfsim.errors import ConfigError  # noqa: E402  (light: no torch)


def rows(shape: tuple[int, ...], world_size: int = 2) -> list[dict]:
    """One dict per registered compressor, columns :data:`COLUMNS`."""
    if not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"--world-size {world_size!r}: must be an integer >= 1")
    from perfsim.compression import compressor_classes

    out = []
    fp32 = 4
    for n in shape:
        fp32 *= n
    for name, cls in sorted(compressor_classes().items()):
        comp = build_example(cls)
        if comp is None:
            out.append({"name": name, "spec": cls.spec_syntax, "allreduce_compatible": cls.allreduce_compatible,
                        "wire_bytes": None, "ratio": None, "dp_bytes": None, "dp_ratio": None})
            continue
        try:
            wb = int(comp.wire_bytes(shape))
        except ConfigError:  # this compressor cannot take that shape: say n/a, keep the others
            out.append({"name": name, "spec": comp.spec or name,
                        "allreduce_compatible": bool(comp.allreduce_compatible), "wire_bytes": None, "ratio": None,
                        "dp_bytes": None, "dp_ratio": None})
            continue
        try:
            dp = int(sum(s.nbytes for s in comp.dp_plan(shape, world_size)))
        except ConfigError:
            dp = None
        out.append({"name": name, "spec": comp.spec or name,
                    "allreduce_compatible": bool(comp.allreduce_compatible),
                    "wire_bytes": wb, "ratio": wb / fp32, "dp_bytes": dp,
                    "dp_ratio": None if dp is None else dp / fp32})
    return out


def run(args) -> int:
    import csv
    import sys

    shape = parse_shape(args.shape)
    table = rows(shape, args.world_size)
    if args.format == "csv":
        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(COLUMNS)
        for r in table:
            w.writerow(["" if r[c] is None else (f"{r[c]:.6g}" if c.endswith("ratio") else r[c]) for c in COLUMNS])
        return 0
    from rich.console import Console
    from rich.table import Table

    from perfsim.compression import compressor_classes

    classes = compressor_classes()
    t = Table(title=f"compressors for shape {'x'.join(map(str, shape))} "
                    f"(fp32 = {4 * _prod(shape):,} bytes)")
    for col, justify in (("name", "left"), ("spec syntax", "left"), ("example", "left"),
                         ("allreduce", "center"), ("wire bytes", "right"), ("ratio", "right"),
                         (f"dp bytes (W={args.world_size})", "right"), ("dp ratio", "right")):
        t.add_column(col, justify=justify)
    for r in table:
        t.add_row(r["name"], classes[r["name"]].spec_syntax, r["spec"],
                  "yes" if r["allreduce_compatible"] else "no",
                  "n/a" if r["wire_bytes"] is None else f"{r['wire_bytes']:,}",
                  "n/a" if r["ratio"] is None else f"{r['ratio']:.4f}",
                  "n/a" if r["dp_bytes"] is None else f"{r['dp_bytes']:,}",
                  "n/a" if r["dp_ratio"] is None else f"{r['dp_ratio']:.4f}")
    Console(width=max(Console().width, 150)).print(t)
    return 0


def _prod(shape) -> int:
    out = 1
    for d in shape:
        out *= d
    return out
