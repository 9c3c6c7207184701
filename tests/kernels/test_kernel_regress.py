"""scripts/kernel_regress.py on recorded H100 runs (traces/gpu): a drop of more than 5 points of
the copy-bandwidth share fails loudly, naming kernel, bits, size, old and new share."""

from __future__ import annotations

import csv
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SCRIPT = os.path.join(ROOT, "scripts", "kernel_regress.py")
GPU = os.path.join(ROOT, "traces", "gpu")
ACCEPTED = os.path.join(GPU, "h100-kernels-2026-11-27.csv")
BISECT = os.path.join(GPU, "h100-bisect-2026-11-27.csv")


def regress(*args):
    p = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def rewrite(src, dst, change):
    with open(src, newline="") as f:
        rows = list(csv.DictReader(f))
    rows = change(rows)
    with open(dst, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return dst


def lower(rows, size, kernel, bits, points):
    for r in rows:
        if (r["size"], r["kernel"], r["bits"], r["way"]) == (size, kernel, str(bits), "triton"):
            r["pct_copy"] = str(float(r["pct_copy"]) - points)
    return rows


def test_main_fails_against_the_fixed_branch_and_the_branch_passes_against_1bac840():
    rc, _, err = regress(BISECT, "--tree", "bbe8f3b", "--baseline", BISECT, "--baseline-tree", "cur")
    assert rc == 1
    assert "REGRESSION encode 4-bit (triton) at 256MB: 94.2 % -> 34.3 % of copy bandwidth" in err
    assert "FAILED, 23 of 32 rows" in err
    rc, out, _ = regress(BISECT, "--tree", "cur", "--baseline", BISECT, "--baseline-tree", "1bac840")
    assert rc == 0 and "28 rows within 5 points" in out


def test_a_drop_beyond_the_tolerance_is_named_and_one_within_it_passes(tmp_path):
    bad = rewrite(ACCEPTED, tmp_path / "bad.csv", lambda r: lower(r, "256MB", "aqsgd", 3, 5.5))
    rc, _, err = regress(str(bad), "--baseline", ACCEPTED)
    assert rc == 1
    lines = [ln for ln in err.splitlines() if "REGRESSION" in ln]
    assert len(lines) == 1 and "aqsgd 3-bit (triton) at 256MB" in lines[0] and "(-5.5 points" in lines[0]
    ok = rewrite(ACCEPTED, tmp_path / "ok.csv", lambda r: lower(r, "256MB", "aqsgd", 3, 4.5))
    assert regress(str(ok), "--baseline", ACCEPTED)[0] == 0
    # a larger tolerance, and the reference ways are not compared unless asked
    assert regress(str(bad), "--baseline", ACCEPTED, "--tolerance", "6")[0] == 0
    slow_torch = rewrite(ACCEPTED, tmp_path / "torch.csv", lambda rows: [
        dict(r, pct_copy="0.1") if r["way"] == "torch" else r for r in rows])
    assert regress(str(slow_torch), "--baseline", ACCEPTED)[0] == 0
    assert regress(str(slow_torch), "--baseline", ACCEPTED, "--ways", "torch")[0] == 1


def test_repeated_passes_count_by_their_median(tmp_path):
    def three_passes(rows):
        out = []
        for p in (1, 2, 3):
            for r in rows:
                r2 = dict(r, **{"pass": str(p)})
                if p == 2 and r["way"] == "triton":  # one disturbed pass of every kernel
                    r2["pct_copy"] = str(float(r["pct_copy"]) / 2)
                out.append(r2)
        return out

    rep = rewrite(ACCEPTED, tmp_path / "rep.csv", three_passes)
    assert regress(str(rep), "--baseline", ACCEPTED)[0] == 0


def test_the_default_baseline_is_the_newest_accepted_run():
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    try:
        import kernel_regress
    finally:
        sys.path.pop(0)
    assert os.path.basename(kernel_regress.latest_accepted()) == "h100-kernels-2026-11-27.csv"


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    for args in ([str(tmp_path / "missing.csv"), "--baseline", ACCEPTED],
                 [BISECT, "--baseline", ACCEPTED],  # several trees, none named
                 [ACCEPTED, "--baseline", ACCEPTED, "--tolerance", "-1"]):
        rc, out, err = regress(*args)
        assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, (args, err)
    other = rewrite(ACCEPTED, tmp_path / "h200.csv", lambda rows: [dict(r, device="NVIDIA H200") for r in rows])
    rc, _, err = regress(str(other), "--baseline", ACCEPTED)
    assert rc == 2 and "not comparable" in err
    tiny = rewrite(ACCEPTED, tmp_path / "tiny.csv", lambda rows: [dict(r, size_bytes="1") for r in rows])
    rc, _, err = regress(str(tiny), "--baseline", ACCEPTED)
    assert rc == 2 and "have no (size, kernel, bits, way) in common" in err
