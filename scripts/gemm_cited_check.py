"""Cited A100 GEMM measurements against perfsim's own A100 GEMM pricing (issue 37, item 1).

Reads every ``traces/open/gemm-a100-*.json`` (published kernel-level GEMM measurements on A100s:
each file's ``source`` block quotes the text the numbers were read from, with its URL and date)
and prices each shape with the code ``perfsim predict`` uses: :func:`perfsim.engine.compute.op_time`
over the GPU preset's curve (:func:`perfsim.hardware.curve_for`), with the host floor per operator
(``kernel_s``) set to 0 -- the cited figures are device times of one GEMM, the floor is the
framework's time to issue an operator, which a kernel benchmark does not contain. No other model.

For each measurement: the cited TFLOP/s (``2 m n k / time`` where the source gives a time; its
stated TFLOP/s otherwise, and a flag where a stated figure does not follow from its time), the
predicted TFLOP/s, and the signed error ``(predicted - cited) / cited`` (negative: perfsim's curve
is slower than the measured kernel). Grouped by software generation, form factor and size class
(smallest GEMM dimension: large >= 2048, medium >= 512, small below). Then the curve's rate on the
GEMMs of Megatron-LM's Table 1 rows (arXiv:2104.04473; ``traces/open/megatron-weak-scaling-2104.04473.json``):
the four linear GEMMs of one block as :func:`perfsim.models.ops.block_ops` lists them, priced the
same way. Nothing is fitted; the conclusions are in docs/validation.md ("Do cited A100 GEMM
measurements bound the curve's large-GEMM rate?").

    python scripts/gemm_cited_check.py            # ~1 s
    python scripts/gemm_cited_check.py --json -   # the rows as JSON
    python scripts/gemm_cited_check.py --gemm-quantization waves   # with GEMM tile and wave quantization

``--gemm-quantization waves`` prices every shape with the curve's ``gemm_quantization = waves``
(:mod:`perfsim.engine.gemm_waves`: output tiles in waves over the GPU's SMs); :data:`CURVE_FIELDS`
holds every field so replaced on each preset's curve (a refitted curve's, set by a caller).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path

from perfsim.engine.compute import op_time
from perfsim.hardware import BYTES_PER_VALUE, curve_for, get_gpu
from perfsim.models.ops import Op, block_ops
from perfsim.models.registry import get_spec
from perfsim.errors import ConfigError, OutputError
from perfsim.outputs import write_bytes

ROOT = Path(__file__).resolve().parents[1]
OPEN = ROOT / "traces" / "open"
#: a stated TFLOP/s more than this far from ``2 m n k / time`` is flagged (the sources round to ~3 digits)
STATED_TOLERANCE = 0.01
#: smallest GEMM dimension at which a size class starts (largest first)
SIZE_CLASSES = (("large", 2048), ("medium", 512), ("small", 0))
#: curve fields replaced on every preset's curve before pricing (``--gemm-quantization``; a refit's)
CURVE_FIELDS: dict = {}


def priced_curve(gpu, host_floor: bool = False):
    """The curve ``gpu`` is priced with (:func:`curve_for`; host floor ``kernel_s`` 0 unless
    ``host_floor``), with :data:`CURVE_FIELDS` replaced."""
    curve, _ = curve_for(gpu, host_overhead_s=None if host_floor else 0.0)
    return replace(curve, **CURVE_FIELDS)


def load(paths=None) -> list[dict]:
    """Every measurement of the cited files, each with its file's ``gpu`` (a perfsim preset;
    a measurement may name its own), ``gpu_stated``, ``source`` URL and file name."""
    rows = []
    for path in sorted(paths or OPEN.glob("gemm-a100-*.json")):
        doc = json.loads(Path(path).read_text())
        for m in doc["measurements"]:
            rows.append({"gpu": doc["gpu"], "gpu_stated": doc["gpu_stated"], **m,
                         "url": doc["source"]["url"], "file": Path(path).name})
    return rows


def size_class(m: int, n: int, k: int) -> str:
    smallest = min(m, n, k)
    return next(name for name, low in SIZE_CLASSES if smallest >= low)


def form_factor(stated: str) -> str:
    """``sxm4``, ``pcie`` or ``unstated``, as the source names the GPU."""
    s = stated.upper()
    return "sxm4" if "SXM" in s else "pcie" if "PCIE" in s else "unstated"


def cited_tflops(row: dict) -> tuple[float, bool | None]:
    """(cited TFLOP/s, whether a stated TFLOP/s agrees with the stated time: None without both)."""
    flops = 2.0 * row["m"] * row["n"] * row["k"]
    stated = row.get("tflops_stated")
    if "time_ms" not in row:
        return float(stated), None
    rate = flops / (row["time_ms"] * 1e-3) / 1e12
    if stated is None:
        return rate, None
    return rate, abs(stated - rate) / rate <= STATED_TOLERANCE


def predicted_tflops(m: int, n: int, k: int, gpu_name: str, dtype: str, host_floor: bool = False) -> float:
    """TFLOP/s perfsim gives one ``m x n x k`` GEMM on the preset ``gpu_name`` at ``dtype``:
    :func:`op_time` over the preset's curve with no host floor (device time), or ``host_floor``:
    with the curve's ``kernel_s`` as predict applies it."""
    gpu = get_gpu(gpu_name)
    curve = priced_curve(gpu, host_floor)
    op = Op("gemm", m, n, k)
    return op.flops / op_time(op, gpu, dtype, curve, BYTES_PER_VALUE[dtype]) / 1e12


def evaluate(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        cited, consistent = cited_tflops(r)
        pred = predicted_tflops(r["m"], r["n"], r["k"], r["gpu"], r["dtype"])
        peak = get_gpu(r["gpu"]).peak(r["dtype"]) / 1e12
        out.append({**r, "cited_tflops": cited, "stated_consistent": consistent,
                    "predicted_tflops": pred, "error": pred / cited - 1.0,
                    "predicted_floor_tflops": predicted_tflops(r["m"], r["n"], r["k"], r["gpu"], r["dtype"], True),
                    "cited_of_peak": cited / peak, "predicted_of_peak": pred / peak,
                    "size": size_class(r["m"], r["n"], r["k"]), "form": form_factor(r["gpu_stated"])})
    return out


def groups(results: list[dict]) -> dict[tuple[str, str, str], list[dict]]:
    """Results by (software generation, form factor, size class)."""
    out: dict[tuple[str, str, str], list[dict]] = {}
    for r in results:
        out.setdefault((r["generation"], r["form"], r["size"]), []).append(r)
    return out


def _megatron_open_data():
    """scripts/megatron_open_data.py, the one reader of Table 1's data file."""
    spec = importlib.util.spec_from_file_location("megatron_open_data", ROOT / "scripts" / "megatron_open_data.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def table1_gemms(gpu_name: str = "a100-sxm4-80gb") -> list[dict]:
    """Per Table 1 row: the linear GEMMs of one block on one tensor-parallel rank
    (:func:`block_ops`: QKV, projection, MLP up and down; fp16, the row's micro-batch and TP) and
    the curve's rate over them (their FLOPs over their summed device times)."""
    doc, rows = _megatron_open_data().load()
    w = doc["workload"]
    gpu = get_gpu(gpu_name)
    curve = priced_curve(gpu)
    bpv = BYTES_PER_VALUE["fp16"]
    out = []
    for row in rows:
        spec = get_spec(f"gpt:layers={row['layers']},hidden={row['hidden']},heads={row['heads']},"
                        f"seq={w['seq_len']},vocab={w['vocab']}")
        ops = [o for o in block_ops(spec, row["micro_batch"], row["tp"], False, bpv)
               if o.m and o.batch == 1 and not o.flash]
        flops = sum(o.flops for o in ops)
        secs = sum(op_time(o, gpu, "fp16", curve, bpv) for o in ops)
        out.append({"params_b": row["params_b"], "hidden": row["hidden"], "tp": row["tp"],
                    "micro_batch": row["micro_batch"], "shapes": [(o.name, o.m, o.n, o.k) for o in ops],
                    "tflops": flops / secs / 1e12, "of_peak": flops / secs / gpu.peak("fp16")})
    return out


def _print(results: list[dict], table1: list[dict]) -> None:
    print("Cited A100 GEMMs against perfsim's A100 GEMM pricing (pred: op_time, host floor 0; "
          "error = (pred - cited) / cited;\nfloor: op_time with the curve's host floor kernel_s, as predict "
          "prices one operator)" + (f"; curve fields replaced: {CURVE_FIELDS}" if CURVE_FIELDS else "") + "\n")
    print(f"{'source':<40} {'gpu':<15} {'dtype':<5} {'m x n x k':<20} {'provider':<24} {'software':<30} "
          f"{'cited':>7} {'pred':>7} {'error':>8} {'floor':>7}")
    for r in results:
        flag = "" if r["stated_consistent"] in (None, True) else "  (stated figure disagrees with its time)"
        print(f"{r['file'][len('gemm-a100-'):-5]:<40} {r['gpu']:<15} {r['dtype']:<5} "
              f"{r['m']}x{r['n']}x{r['k']:<8} {r['provider'][:24]:<24} {r['software'][:30]:<30} "
              f"{r['cited_tflops']:7.1f} {r['predicted_tflops']:7.1f} {100 * r['error']:+7.1f}% "
              f"{r['predicted_floor_tflops']:7.1f}{flag}")
    print("\nBy software generation, form factor, size class (cited fraction of peak min-max; "
          "mean signed error)")
    for (gen, form, size), rs in sorted(groups(results).items()):
        errs = [r["error"] for r in rs]
        fr = [r["cited_of_peak"] for r in rs]
        print(f"  {gen:<16} {form:<9} {size:<7} n={len(rs):<2} cited {min(fr):.3f}-{max(fr):.3f} of peak, "
              f"curve {rs[0]['predicted_of_peak']:.3f}; error {100 * min(errs):+.1f} to {100 * max(errs):+.1f}%, "
              f"mean {100 * sum(errs) / len(errs):+.1f}%")
    print("\nThe curve on Table 1's block GEMMs (a100-sxm4-80gb, fp16, one TP rank; TFLOP/s and fraction of peak)")
    for t in table1:
        dims = sorted({d for _, m, n, k in t["shapes"] for d in (m, n, k)})
        print(f"  {t['params_b']:>7} B  h {t['hidden']:>5}  t {t['tp']}  mb {t['micro_batch']:>2}  "
              f"dims {dims[0]}-{dims[-1]}  {t['tflops']:6.1f} TFLOP/s ({t['of_peak']:.3f})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--json", metavar="PATH", help="write the rows as JSON (- for stdout)")
    ap.add_argument("--gemm-quantization", default=None, metavar="Q",
                    help="price with every curve's gemm_quantization Q: off or waves (default: the curve's)")
    args = ap.parse_args(argv)
    if args.gemm_quantization is None:
        return _run(args)
    try:
        replace(get_gpu("a100").curve, gemm_quantization=args.gemm_quantization)  # Curve checks it
    except ConfigError as exc:
        print(f"error: --gemm-quantization: {exc}", file=sys.stderr)
        return 2
    before = dict(CURVE_FIELDS)
    CURVE_FIELDS["gemm_quantization"] = args.gemm_quantization
    try:
        return _run(args)
    finally:
        CURVE_FIELDS.clear()
        CURVE_FIELDS.update(before)


def _run(args) -> int:
    results = evaluate(load())
    table1 = table1_gemms()
    if args.json:
        data = (json.dumps({"measurements": results, "table1": table1}, indent=1) + "\n").encode()
        try:
            write_bytes(args.json, data)  # atomic; - is standard output
        except OutputError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0
    _print(results, table1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
