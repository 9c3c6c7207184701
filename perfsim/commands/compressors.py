"""``perfsim compressors``: the compression specs predict and run accept, with
their syntax and exact wire size for one tensor shape -- alone (``wire_bytes``:
one payload) and in data parallel (``dp_bytes``: what each of ``--world-size``
ranks feeds to the collectives of one gradient exchange, the sum of the
compressor's ``dp_plan``, the number the simulator charges).

One row per (role, spec): ``grad`` rows are ``--grad-compress`` values: every
registered compressor (``name``), built from a representative spec (its
``example_spec`` class attribute; failing that, its bare name, then its
``spec_syntax`` with the usual placeholders filled in), and the 1-bit
optimizers; ``pipeline`` rows are ``--compress`` values
(:data:`perfsim.compression.spec.PIPELINE_EXAMPLES`; sizes of the forward
direction). Each ``spec`` is the canonical text
(:class:`perfsim.compression.spec.Spec`); sizes are asked from the compressor
objects, never computed here. Columns: :data:`COLUMNS` (ratios relative to the
fp32 bytes).
"""

from __future__ import annotations

import re

HELP = "list the compression specs predict and run accept, with syntax and exact wire bytes"
EXAMPLES = """examples:
  perfsim compressors
  perfsim compressors --shape 1,1024,1600 --format csv
  perfsim compressors --format json | jq '.[] | select(.role == "grad") | .spec'
  perfsim compressors --shape 1,1024,1600 -o specs.csv
"""

FORMATS = ("table", "csv", "json")

DEFAULT_SHAPE = "1,1024,1600"
COLUMNS = ("role", "name", "family", "spec", "label", "syntax", "allreduce_compatible",
           "wire_bytes", "ratio", "dp_bytes", "dp_ratio")

#: placeholder -> value used when a class gives no example_spec
_PLACEHOLDERS = {"BITS": "4", "FRACTION": "0.01", "RANK": "4", "LEVELS": "7", "K": "0.01",
                 "FWBITS": "4", "BWBITS": "8"}


def add_arguments(parser) -> None:
    parser.add_argument("--shape", default=DEFAULT_SHAPE,
                        help=f"tensor shape, comma-separated (default {DEFAULT_SHAPE}: one GPT2-1.5B "
                             "boundary activation)")
    from perfsim.commands import add_out

    parser.add_argument("--format", choices=FORMATS, default=None,
                        help="output format (default: from the --out suffix, else table)")
    add_out(parser, None, "write to this file (atomically; .txt, .csv or .json picks the format) instead of stdout",
            metavar="FILE")
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


def _row(role: str, spec, syntax: str, comp, shape, fp32: int, world_size: int) -> dict:
    from perfsim.compression.spec import parse_spec
    from perfsim.errors import ConfigError

    parsed = parse_spec(spec, role)
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
    from perfsim.compression import compressor_classes, make_compressor, make_pipeline_pair
    from perfsim.compression.refresh import BOUNDS
    from perfsim.compression.spec import EXCHANGES, OPTIMIZERS, PIPELINE_ONLY, parse_spec
    from perfsim.errors import ConfigError

    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ConfigError(f"--world-size {world_size!r}: must be an integer >= 1")
    fp32 = 4 * _prod(shape)
    classes = compressor_classes()
    out = [_row("grad", "none", "none", make_compressor("fp32"), shape, fp32, world_size)]
    for name, cls in sorted(classes.items()):
        if name == "fp32" or name in PIPELINE_ONLY:
            continue
        comp = build_example(cls)
        spec = comp.spec or name if comp is not None else name
        out.append(_row("grad", spec, cls.spec_syntax, comp, shape, fp32, world_size))
    for name in OPTIMIZERS:  # the 1-bit optimizers exchange momentum with the onebit compressor
        syntax = (f"{name}[:warmup=STEPS][:exchange={'|'.join(EXCHANGES)}][:refresh=K]"
                  f"[:bound={'|'.join(BOUNDS)}]")
        out.append(_row("grad", name, syntax,
                        make_compressor("onebit"), shape, fp32, world_size))
    for text in PIPELINE_EXAMPLES():
        spec = parse_spec(text, "pipeline")  # read once; the pair and the row take the value
        fw, _ = make_pipeline_pair(spec)
        out.append(_row("pipeline", spec, _pipeline_syntax(classes[spec.name]), fw, shape, fp32, world_size))
    return out


def PIPELINE_EXAMPLES() -> tuple[str, ...]:
    from perfsim.compression.spec import PIPELINE_EXAMPLES as examples

    return examples


def run(args) -> int:
    from perfsim import outputs

    fmt = outputs.output_format(args.out, args.format, allowed=FORMATS, flag="--out")  # before any work
    if args.out:
        outputs.check_file_target(args.out, "--out")
    shape = parse_shape(args.shape)
    text = render(rows(shape, args.world_size), shape, args.world_size, fmt, to_file=bool(args.out))
    if args.out:
        outputs.write_text(args.out, text)
    else:
        outputs.write_stdout(text)
    return 0


def render(table: list[dict], shape, world_size: int, fmt: str, to_file: bool = False) -> str:
    """The rows of :func:`rows` as ``fmt`` text (``table``: a rich table, plain on a file)."""
    import csv
    import io
    import json

    if fmt == "json":
        return json.dumps(table, indent=1) + "\n"
    buf = io.StringIO()
    if fmt == "csv":
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(COLUMNS)
        for r in table:
            w.writerow(["" if r[c] is None else (f"{r[c]:.6g}" if c.endswith("ratio") else r[c]) for c in COLUMNS])
        return buf.getvalue()
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"compression specs for shape {'x'.join(map(str, shape))} "
                    f"(fp32 = {4 * _prod(shape):,} bytes; pipeline rows: forward direction)")
    for col, justify in (("role", "left"), ("spec (accepted as is)", "left"), ("syntax", "left"),
                         ("allreduce", "center"), ("wire bytes", "right"), ("ratio", "right"),
                         (f"dp bytes (W={world_size})", "right"), ("dp ratio", "right")):
        t.add_column(col, justify=justify)
    for r in table:
        t.add_row("--compress" if r["role"] == "pipeline" else "--grad-compress", r["spec"], r["syntax"],
                  "" if r["allreduce_compatible"] is None else "yes" if r["allreduce_compatible"] else "no",
                  "n/a" if r["wire_bytes"] is None else f"{r['wire_bytes']:,}",
                  "n/a" if r["ratio"] is None else f"{r['ratio']:.4f}",
                  "n/a" if r["dp_bytes"] is None else f"{r['dp_bytes']:,}",
                  "n/a" if r["dp_ratio"] is None else f"{r['dp_ratio']:.4f}")
    if to_file:
        Console(file=buf, width=150, color_system=None).print(t)
    else:
        import sys

        Console(file=buf, width=max(Console(file=sys.stdout).width, 150),
                force_terminal=sys.stdout.isatty()).print(t)
    return buf.getvalue()


def _prod(shape) -> int:
    out = 1
    for d in shape:
        out *= d
    return out
