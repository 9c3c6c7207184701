"""Issue 39's hostile probes of ``perfsim run``, ``calibrate``, ``predict`` and the README,
kept as regression tests: no silently lost work, no silent wrong answer, hints that work.

Real runs are few and tiny (digits-mlp, 2 stages, 2-4 steps) and shared through
module-scoped fixtures; each test that changes a run's folder works on a copy.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from _helpers import assert_user_error, run_cli_here

JOB = ["--model", "digits-mlp", "--pp", "2", "--schedule", "1f1b", "--micro-batch", "4", "--macro-batch", "16",
       "--dataset-limit", "32", "--timeout", "60s", "--no-progress"]


def _losses(out: Path) -> dict[int, float]:
    data = json.loads((out / "result.json").read_text())
    return {int(d["step"]): d["loss"] for d in data["losses"]}


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """A finished 4-step run with a non-default pipeline compression, checkpointed at
    steps 2 and 4 (the folder every probe below starts from; never changed)."""
    out = tmp_path_factory.mktemp("hostile") / "first"
    proc = run_cli_here("run", *JOB, "--compress", "directq:fw4bw8", "--steps", "4",
                        "--checkpoint-every", "2", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    return dst


# ------------------------------------------------------------ 1. no overwrite
def test_run_on_a_folder_holding_a_run_is_refused(first_run):
    before = {p.name: p.stat().st_mtime_ns for p in first_run.glob("[!.]*") if p.is_file()}
    proc = run_cli_here("run", *JOB, "--steps", "2", "--out", str(first_run))
    assert_user_error(proc.returncode, proc.stderr, "--overwrite")
    assert "--resume" in proc.stderr and "result.json" in proc.stderr and "ckpt/" in proc.stderr
    assert {p.name: p.stat().st_mtime_ns for p in first_run.glob("[!.]*") if p.is_file()} == before


@pytest.fixture(scope="module")
def overwritten(first_run, tmp_path_factory):
    """``--overwrite`` of a copy of the first run by a 2-step AQ-SGD run whose message
    buffers live on disk (``disk=PATH``)."""
    base = tmp_path_factory.mktemp("overwrite")
    out = _copy(first_run, base)
    buffers = base / "buffers"
    proc = run_cli_here("run", *JOB, "--compress", f"aqsgd:fw3bw6:disk={buffers}", "--steps", "3",
                        "--overwrite", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    return out, buffers


def test_overwrite_removes_the_earlier_runs_checkpoints(overwritten):
    out, _ = overwritten
    # the first run's step 2 and 4 checkpoints are gone: only this run's step 3
    assert sorted(p.name for p in (out / "ckpt").glob("step*")) == ["step00000003"]
    assert sorted(_losses(out)) == [0, 1, 2]
    assert json.loads((out / "result.json").read_text())["summary"]["compress"].startswith("aqsgd")


# ------------------------------------------------------------ 3. disk buffers
def test_disk_buffers_are_removed_when_the_run_completes(overwritten):
    _, buffers = overwritten
    assert buffers.is_dir()  # the run used them (they were created there) ...
    assert list(buffers.iterdir()) == []  # ... and removed them once it completed


# ------------------------------------------------------------ 2. resume
def test_resume_flags_must_agree_with_the_checkpoint(first_run):
    proc = run_cli_here("run", "--resume", str(first_run), "--compress", "fp32", "--steps", "6",
                        "--no-progress")
    assert_user_error(proc.returncode, proc.stderr, "--compress 'fp32'")
    assert "'directq:fw4bw8'" in proc.stderr


def test_following_the_corrupt_checkpoint_hint_resumes_the_run_in_its_folder(first_run, tmp_path):
    out = _copy(first_run, tmp_path)
    bad = out / "ckpt" / "step00000004" / "rank1.pt"
    bad.write_bytes(bad.read_bytes()[:100])  # truncated, as by a full disk
    proc = run_cli_here("run", "--resume", str(out), "--steps", "6", "--no-progress")
    assert proc.returncode == 2 and "corrupt" in proc.stderr, proc.stderr
    hint = re.search(r"(--resume \S+)$", proc.stderr.strip()).group(1).split()
    # the hint as given: no flag repeated (the model and --compress come from the checkpoint)
    proc = run_cli_here("run", *hint, "--no-progress")
    assert proc.returncode == 0, proc.stderr
    step_dir = Path(hint[1])
    assert not (step_dir / "ckpt").exists() and not (step_dir / "result.json").exists()
    data = json.loads((out / "result.json").read_text())
    assert data["summary"]["start_step"] == 2 and data["summary"]["compress"] == "directq:fw4bw8"
    assert _losses(out) == _losses(first_run)  # bit-for-bit the uninterrupted run's losses


# ------------------------------------------------------------ 4. steps and epochs
def test_steps_and_epochs_together_are_refused(tmp_path):
    proc = run_cli_here("run", *JOB, "--steps", "5", "--epochs", "1", "--out", str(tmp_path / "r"))
    assert_user_error(proc.returncode, proc.stderr, "epochs")
    assert not (tmp_path / "r").exists()


# ------------------------------------------------------------ 5. calibrate's estimate
def test_calibrate_estimate_is_derived_from_the_models_work():
    from perfsim.calibrate.calibration import compute_work_seconds, plan_calibration
    from perfsim.calibrate.compute import ComputeConfig

    rate = 50e9  # FLOP/s, as if probed
    # the arithmetic: no time cap, so every layer's forward is called warmup + repeats times,
    # its backward as often after an untimed forward (3 forwards' worth each time)
    cfg = ComputeConfig(model="gpt2-tiny", micro_batches=(1, 4), warmup=2, repeats=5, max_seconds=None)
    fwd = sum(lay.flops_fwd for lay in cfg.spec.layers()) / rate
    assert compute_work_seconds(cfg, rate) == pytest.approx((2 + 5) * 4 * fwd * (1 + 4))
    # whole stages (degrees 1 and 2): each degree covers the model once per call
    staged = ComputeConfig(model="gpt2-tiny", micro_batches=(1,), warmup=2, repeats=5, max_seconds=None,
                           stages=(1, 2), stage_microbatches=4)
    steps = 2 + max(3, -(-5 // 4))
    assert compute_work_seconds(staged, rate) == pytest.approx((2 + 5) * 4 * fwd + 2 * steps * 4 * 3 * fwd)
    # monotone in the model's size, and gpt2-xl --quick is no 47 s job (it ran > 120 s)
    est = [plan_calibration(model=m, quick=True).estimate_seconds(flops_per_s=rate)
           for m in ("digits-mlp", "gpt2-tiny", "gpt2-small-byte", "gpt2-xl")]
    assert est == sorted(est) and len(set(est)) == 4
    assert est[-1] > 100 * plan_calibration(model="gpt2-xl", quick=True).estimate_seconds()
    # a slower machine takes longer
    xl = plan_calibration(model="gpt2-xl", quick=True)
    assert xl.estimate_seconds(flops_per_s=rate / 10) > xl.estimate_seconds(flops_per_s=rate)


# ------------------------------------------------------------ 6. the default is the paper's setup
def test_default_prediction_is_the_aqsgd_papers_setup():
    import perfsim

    r = perfsim.predict()
    # 8 stages of equal compute, 45 ms forward / 135 ms backward per micro-batch (paper Table 3)
    assert {(round(m["fwd_compute_s"], 6), round(m["bwd_compute_s"], 6)) for m in r.microbatches} == \
        {(0.045, 0.135)}
    # the paper's layout: 6 blocks per stage, the embedding on the first, the LM head on the last
    paper = perfsim.predict(partition="7,6,6,6,6,6,6,7")
    assert [s["layers"] for s in r.stages] == [s["layers"] for s in paper.stages]
    assert r.summary["iteration_s"] == pytest.approx(paper.summary["iteration_s"])
    idle = [s["idle_s"] for s in r.stages]
    assert max(idle) < 1.5 * min(idle)  # no stage idles most of the iteration


# ------------------------------------------------------------ 7. memory over the GPU
def test_memory_over_the_profiles_gpu_is_a_one_line_warning(tmp_path):
    import perfsim

    # the paper's setup without its recomputation (every block checkpointed) holds 32 micro-batches
    proc = run_cli_here("predict", "--recompute", "none", "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "memory" in ln]
    assert len(lines) == 1 and lines[0].startswith("warning: peak memory 72.0 GiB per GPU exceeds the "
                                                   "profile's GPU (v100-sxm2-16gb, 16 GiB)"), proc.stderr
    r = perfsim.predict(recompute="none")
    assert "warning: " + r.summary["memory_warning"] == lines[0]
    assert "memory_warning" not in perfsim.predict().summary  # as the paper ran it, 12.0 GiB: fits
    # no GPU known: warn only above every preset's memory
    prof = json.loads(Path(perfsim.__file__).with_name("data").joinpath("default-v100-aqsgd.json").read_text())
    prof["metadata"]["device"] = "a box of unknown accelerators"
    path = tmp_path / "unknown.json"
    path.write_text(json.dumps(prof))
    assert "memory_warning" not in perfsim.predict(profile=str(path), recompute="none").summary
    big = perfsim.predict(profile=str(path), micro_batch=4, macro_batch=128, recompute="none").summary
    assert "every GPU preset" in big["memory_warning"] and big["peak_memory_gib"] > 179


# ------------------------------------------------------------ 8. README claims
README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_calls_resolve():
    import importlib

    import perfsim

    calls = set(re.findall(r"`(perfsim(?:\.\w+)+)\(", README.read_text()))
    assert "perfsim.plan" in calls
    for dotted in sorted(calls):
        parts = dotted.split(".")
        for k in range(2, len(parts)):  # what `import perfsim.a.b` would import first
            try:
                importlib.import_module(".".join(parts[:k]))
            except ImportError:
                break
        obj = perfsim
        for name in parts[1:]:
            assert hasattr(obj, name), f"README: {dotted}(...) does not resolve ({name!r})"
            obj = getattr(obj, name)
        assert callable(obj), dotted


def test_readme_extras_exist_and_every_command_takes_out(tmp_path):
    import argparse
    import tomllib

    from perfsim.cli import COMMANDS, build_parser

    text = README.read_text()
    sentence = text[text.index("extras:"):].split(".\n")[0]
    named = re.findall(r"`([\w-]+)` \(", sentence)
    extras = tomllib.loads((README.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert named and set(named) <= set(extras), (named, sorted(extras))
    assert "every command names its output `-o/--out`" in text
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name in COMMANDS:
        options = {o for a in sub.choices[name]._actions for o in a.option_strings}
        assert {"-o", "--out"} <= options, name
    out = tmp_path / "specs.csv"
    proc = run_cli_here("compressors", "--shape", "1,8,16", "-o", str(out))
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr
    assert out.read_text().startswith("role,name,family,spec")


def test_readme_schedule_claims_hold():
    """The "when each wins" figures (docs/usage.md, "Schedules"; in the README until issue 38),
    re-measured with the command it lists."""
    import perfsim

    text = " ".join((README.parent / "docs" / "usage.md").read_text().split())
    para = text[text.index("When each wins on the default"):text.index("ZB-H1's memory equals")]
    assert "perfsim predict --schedule gpipe,1f1b,interleaved-1f1b,zb-h1,zb-v" in para
    t = {}
    for comp in ("fp32", "aqsgd:fw3bw6"):
        for bw in ("10Gbps", "1Gbps", "100Mbps"):
            for sched in ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v"):
                t[comp, bw, sched] = perfsim.predict(schedule=sched, bandwidth=bw, compress=comp).summary[
                    "throughput_samples_per_s"]

    def best(comp, bw):
        return max(("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v"), key=lambda s: t[comp, bw, s])

    def x(comp, bw, sched):
        return f"{t[comp, bw, sched] / t[comp, bw, '1f1b']:.2f}x"

    fp, aq = "fp32", "aqsgd:fw3bw6"
    assert best(fp, "10Gbps") == best(aq, "10Gbps") == "zb-v" and best(aq, "1Gbps") == "zb-v"
    assert best(fp, "1Gbps") == best(fp, "100Mbps") == best(aq, "100Mbps") == "gpipe"
    assert f"at 10 Gbps ZB-V is the fastest ({x(fp, '10Gbps', 'zb-v')} 1F1B with fp32 activations, " \
           f"{x(aq, '10Gbps', 'zb-v')} with AQ-SGD), ZB-H1 close behind ({x(fp, '10Gbps', 'zb-h1')}, " \
           f"{x(aq, '10Gbps', 'zb-h1')})" in para
    assert f"at 1 Gbps GPipe with fp32 activations ({x(fp, '1Gbps', 'gpipe')}) and ZB-V with AQ-SGD " \
           f"({x(aq, '1Gbps', 'zb-v')}); at 100 Mbps GPipe ({x(fp, '100Mbps', 'gpipe')} fp32, " \
           f"{x(aq, '100Mbps', 'gpipe')} AQ-SGD)" in para
    zb = sorted(t[c, b, "zb-h1"] / t[c, b, "1f1b"] for c in (fp, aq) for b in ("10Gbps", "1Gbps", "100Mbps"))
    assert zb[0] >= 1 and f"ZB-H1 is never slower than 1F1B ({zb[0]:.2f}x-{zb[-1]:.2f}x)" in para
    assert f"(interleaved {x(fp, '1Gbps', 'interleaved-1f1b')} at 1 Gbps and " \
           f"{x(fp, '100Mbps', 'interleaved-1f1b')} at 100 Mbps, ZB-V {x(fp, '100Mbps', 'zb-v')} at 100 Mbps)" in para
