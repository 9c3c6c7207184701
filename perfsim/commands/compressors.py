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
objects, never computed here. Columns: :data:`perfsim.compression.catalog.COLUMNS`
(ratios relative to the fp32 bytes). The rows are built below the commands
(:func:`perfsim.compression.catalog.rows`, also behind ``perfsim.compressors()``);
this command only formats them.
"""

from __future__ import annotations

import io
import math
import sys

from perfsim import outputs
from perfsim.commands import add_out
from perfsim.errors import ConfigError

HELP = "list the compression specs predict and run accept, with syntax and exact wire bytes"
EXAMPLES = """examples:
  perfsim compressors
  perfsim compressors --shape 1,1024,1600 --format csv
  perfsim compressors --format json | jq '.[] | select(.role == "grad") | .spec'
  perfsim compressors --shape 1,1024,1600 -o specs.csv
"""

FORMATS = ("table", "csv", "json")

DEFAULT_SHAPE = "1,1024,1600"


def add_arguments(parser) -> None:
    parser.add_argument("--shape", default=DEFAULT_SHAPE,
                        help=f"tensor shape, comma-separated (default {DEFAULT_SHAPE}: one GPT2-1.5B "
                             "boundary activation)")
    parser.add_argument("--format", choices=FORMATS, default=None,
                        help="output format (default: from the --out suffix, else table)")
    add_out(parser, None, "write to this file (atomically; .txt, .csv or .json picks the format) instead of stdout",
            metavar="FILE")
    parser.add_argument("--world-size", type=int, default=2, metavar="W",
                        help="data-parallel ranks for the dp_bytes column (default 2)")


def parse_shape(text: str) -> tuple[int, ...]:
    """``'1,1024,1600'`` -> ``(1, 1024, 1600)``; ConfigError naming --shape otherwise."""
    parts = [p.strip() for p in str(text).replace("x", ",").split(",")]
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        raise ConfigError(f"--shape {text!r}: expected positive integers separated by commas, "
                          "e.g. 1,1024,1600") from None
    if not shape or any(d <= 0 for d in shape):
        raise ConfigError(f"--shape {text!r}: every dimension must be a positive integer")
    return shape


def run(args) -> int:
    # lazy: perfsim --help does not load perfsim.compression.catalog
    from perfsim.compression.catalog import rows

    fmt = outputs.output_format(args.out, args.format, allowed=FORMATS, flag="--out")  # before any work
    out = None if outputs.is_stdio(args.out) else args.out  # -o -: standard output
    if out:
        outputs.check_file_target(out, "--out")
    shape = parse_shape(args.shape)
    text = render(rows(shape, args.world_size), shape, args.world_size, fmt, to_file=bool(out))
    outputs.emit(out, text)
    return 0


def render(table: list[dict], shape, world_size: int, fmt: str, to_file: bool = False) -> str:
    """The rows of :func:`perfsim.compression.catalog.rows` as ``fmt`` text (``table``: a rich
    table, plain on a file)."""
    # lazy: perfsim --help does not load perfsim.compression.catalog
    from perfsim.compression.catalog import COLUMNS

    if fmt == "json":
        return outputs.json_text(table)
    if fmt == "csv":
        return outputs.records_csv([{c: f"{r[c]:.6g}" if c.endswith("ratio") and r[c] is not None else r[c]
                                     for c in COLUMNS} for r in table], COLUMNS)
    buf = io.StringIO()
    from rich.console import Console  # lazy: perfsim --help does not load rich.console
    from rich.table import Table  # lazy: perfsim --help does not load rich.table

    t = Table(title=f"compression specs for shape {'x'.join(map(str, shape))} "
                    f"(fp32 = {4 * math.prod(shape):,} bytes; pipeline rows: forward direction)")
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
        Console(file=buf, width=max(Console(file=sys.stdout).width, 150),
                force_terminal=sys.stdout.isatty()).print(t)
    return buf.getvalue()

