"""perfsim plan refuses bad input before searching: one line and exit 2 from the CLI,
a ConfigError from perfsim.plan(...) -- never an empty result that fails later
(issues 33 and 39)."""

import os
import subprocess
import sys

import pytest

import perfsim
from perfsim.errors import ConfigError
from perfsim.plan import SearchSpace

from _helpers import run_cli_here

CPU = os.path.join(os.path.dirname(__file__), "..", "..", "traces", "cpu-2core.json")
SMALL = ["--model", "gpt2-tiny", "--nodes", "2", "--global-batch", "8", "--profile", CPU, "--bandwidth", "100Mbps"]


def _plan_cli(*args, tmp_path=None):
    # progress lines every 0 s: a search that had started would print some before failing
    env = {**os.environ, "PERFSIM_PROGRESS_EVERY": "0"}
    return subprocess.run([sys.executable, "-m", "perfsim", "plan", *SMALL, *args], capture_output=True,
                          text=True, timeout=300, env=env, cwd=tmp_path)


BAD_INPUT = [
    (["--compress", "bogus"], "'bogus': unknown"),
    (["--grad-compress", "bogus:9"], "'bogus:9': unknown"),
    (["--compress", "fp32,aqsgd:fw9bw9"], "bits=9: unsupported"),
    (["--zero", "0,5"], "--zero=5"),
    (["--recompute", "bogus"], "--recompute='bogus'"),
    (["--attention", "fast"], "--attention='fast'"),
    (["--schedule", "1f1b,nope"], "--schedule='nope'"),
    (["--tp", "3"], "tp=3: does not divide"),
    # qa1: 8 GPUs asked of a 2-GPU cluster was blamed on "global_batch=8: no TP x PP x DP split"
    (["--tp", "2", "--pp", "2", "--dp", "2"], "tp=2 x pp=2 x dp=2: tp x pp x dp must be the cluster's 2 GPUs"),
    (["--pp", "2", "--dp", "2"], "pp=2 x dp=2: tp x pp x dp must be the cluster's 2 GPUs"),
    (["--pp", "0"], "--pp='0'"),
    (["--micro-batch", "16"], "micro_batch=16: does not divide global_batch=8"),
    (["--seq-len", "64,128"], "takes one value"),
    (["--gpu", "v100", "--precision", "bf16"], "has no bf16"),
    (["--plot", "p.xyz"], "--plot 'p.xyz': unknown format"),
    (["--out", "."], "--out '.': is a directory"),
    (["--plot", "no/such/dir/p.png", "--out", "x.json"], None),
]


@pytest.mark.parametrize("args, culprit", BAD_INPUT)
def test_cli_refuses_bad_input_before_searching(tmp_path, monkeypatch, args, culprit):
    if args == BAD_INPUT[0][0]:  # the first in a real process
        proc = _plan_cli(*args, tmp_path=tmp_path)
    else:  # the rest through perfsim.cli.main in this process, from the same folder and environment
        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("PERFSIM_PROGRESS_EVERY", "0")
        proc = run_cli_here("plan", *SMALL, *args)
    err = proc.stderr.strip().splitlines()
    if culprit is None:  # a missing folder for the plot is created, not refused: the run succeeds
        assert proc.returncode == 0, proc.stderr
        assert (tmp_path / "no/such/dir/p.png").stat().st_size > 1000 and (tmp_path / "x.json").exists()
        return
    assert proc.returncode == 2, proc.stderr
    assert len(err) == 1 and "Traceback" not in proc.stderr, proc.stderr  # no progress line: no search ran
    assert culprit in err[0]
    assert not list(tmp_path.iterdir())  # nothing written


def test_cli_infeasible_cluster_is_one_line():
    proc = subprocess.run([sys.executable, "-m", "perfsim", "plan", "--model", "gpt3-175b", "--gpu", "h100",
                           "--nodes", "1", "--global-batch", "8", "-q"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "no configuration of gpt3-175b on 1 x 1 GPUs fits" in proc.stderr and "short by" in proc.stderr


def test_api_raises_typed_errors():
    common = dict(model="gpt2-tiny", nodes=2, global_batch=8, profile=CPU, bandwidth="100Mbps")
    for kw, msg in ((dict(compress="bogus"), "unknown"), (dict(grad_compress="bogus:9"), "unknown"),
                    (dict(compress="aqsgd:fw9bw9"), "bits=9"), (dict(zero=[0, 5]), "zero=5"),
                    (dict(seq_len=[64, 128]), "one value"), (dict(macro_batch=4), "derives it"),
                    (dict(bogus=1), "unknown parameter"), (dict(tp=[3]), "tp=3")):
        with pytest.raises(ConfigError, match=msg):
            perfsim.plan(**common, **kw)
    with pytest.raises(ConfigError, match="not a search dimension"):
        SearchSpace(bandwidth="1Gbps")
    with pytest.raises(ConfigError, match="given both"):
        perfsim.plan(**common, space=SearchSpace(compress="fp32"), compress="fp16")
    # an infeasible cluster: a typed error, not an empty result
    with pytest.raises(ConfigError, match="fits"):
        perfsim.plan(model="gpt3-175b", gpu="h100", nodes=1, global_batch=8)
    # an empty search: no split of 3 GPUs divides a global batch of 2
    with pytest.raises(ConfigError, match="global_batch=2"):
        perfsim.plan(model="gpt2-tiny", nodes=3, global_batch=2, profile=CPU, pp=[1])


def test_pinned_and_widened_dimensions_are_searched_as_given():
    res = perfsim.plan(model="gpt2-tiny", nodes=2, global_batch=8, profile=CPU, bandwidth="100Mbps", top=100,
                       pp=2, schedule="1f1b,gpipe", compress="fp32,fp16", grad_compress="none", micro_batch=[2, 4])
    seen = {(c.params["pp"], c.params["schedule"], str(c.params["compress"]), c.params["micro_batch"])
            for c in res.all_evaluated}
    assert seen == {(2, s, c, m) for s in ("1f1b", "gpipe") for c in ("fp32", "fp16") for m in (2, 4)}


def test_recompute_and_attention_are_refused_where_nothing_would_change():
    """qa1: `predict --model digits-mlp --recompute full` (or selective, or --attention flash)
    gave the time and memory of `--recompute none` to the digit: the setting applies to a
    transformer's blocks alone. Now predict refuses it naming the setting, and the plan
    (which searched them on a GPU: five top rows that differed only there, 14,880 candidates
    for 1 x 4 A100s) leaves them at their defaults on such a model."""
    for kw in (dict(recompute="full"), dict(recompute="selective", gpu="a100"), dict(attention="flash")):
        with pytest.raises(ConfigError, match=f"{next(iter(kw))}='{next(iter(kw.values()))}': model 'digits-mlp'"):
            perfsim.predict(model="digits-mlp", pp=2, **kw)
    tiny = perfsim.predict(model="gpt2-tiny", pp=2, recompute="full").summary["iteration_s"]
    assert tiny > perfsim.predict(model="gpt2-tiny", pp=2).summary["iteration_s"]  # a transformer: it applies
    wl = dict(workload="example-workload", gpu="a100")  # a workload file's block layers: it applies too
    assert perfsim.predict(**wl, recompute="full").summary["iteration_s"] > \
        perfsim.predict(**wl).summary["iteration_s"]
    with pytest.raises(ConfigError, match="recompute='full': the model is not a transformer"):
        perfsim.plan(model="digits-mlp", nodes=2, bandwidth="1Gbps", global_batch=16, recompute="full")
    result = perfsim.plan(model="digits-mlp", gpu="a100", nodes=1, gpus_per_node=2, bandwidth="1Gbps",
                          global_batch=16, top=5)
    assert {(c.params.get("recompute", "none"), c.params.get("attention", "megatron"))
            for c in result.ranked} == {("none", "megatron")}


@pytest.mark.parametrize("target", [0.5, -1.0])
def test_a_target_loss_the_uncompressed_run_never_reaches_is_refused(target):
    """On one node (no pipeline, no replicas: fp32 only) a target below every measured loss
    ranked by iteration time with an empty "to loss" column and "0.0% slower to the target",
    without a word; with compressed candidates the same target was refused. Both refuse it,
    naming the lowest loss the uncompressed run reaches."""
    with pytest.raises(ConfigError, match=rf"target loss {target}: the uncompressed run never reaches it "
                                          r"\(its lowest smoothed loss [0-9.]+"):
        perfsim.plan(model="gpt2-tiny", nodes=1, global_batch=8, profile=CPU, bandwidth="100Mbps",
                     target_loss=target)
    proc = run_cli_here("plan", "--model", "gpt2-tiny", "--global-batch", "8", "--profile", CPU,
                        f"--target-loss={target}")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "never reaches" in proc.stderr


def test_emit_and_emit_run_together_are_refused():
    """`--emit megatron --emit-run` printed Megatron flags and dropped --emit-run (perfsim run's
    command) silently: contradictory, refused before the search."""
    proc = run_cli_here("plan", *SMALL, "--emit", "megatron", "--emit-run")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "--emit-run" in proc.stderr and "--emit megatron" in proc.stderr
    assert run_cli_here("plan", *SMALL, "--emit", "perfsim", "--emit-run", "--top", "1").returncode == 0
