"""A tied LM head in execute mode (``perfsim run --tied-embedding sync``, perfsim.runtime.tied):
the same model on one or two stages, its all-reduce the bytes the simulator prices."""

import glob
import json

import pytest
import torch

from perfsim.api import predict
from perfsim.errors import ConfigError
from perfsim.runtime import make_config
from perfsim.runtime.checkpoint import check_compatible
from perfsim.runtime.config import RunConfig
from perfsim.workload import load_workload_file

from _helpers import PINNED_FLAGS, PINNED_JOB, assert_user_error, run_cli_here

TIED = dict(model="gpt2-tiny", micro_batch=4, macro_batch=8, steps=4, dataset_limit=32, timeout="60s",
            tied_embedding="sync", schedule="1f1b")


def _final_tables(out):
    """(embedding's token table, LM head's weight) of the last checkpoint of run ``out``."""
    step = sorted(glob.glob(f"{out}/ckpt/step*/"))[-1]
    tables = {}
    for path in glob.glob(step + "rank*.pt"):
        for k, v in torch.load(path, weights_only=False)["model"].items():
            if k.endswith("tok.weight") or k.endswith("lm_head.weight"):
                tables[k.rsplit(".", 2)[-2]] = v
    return tables["tok"], tables["lm_head"]


@pytest.fixture(scope="module")
def tied_runs(tmp_path_factory):
    """``tied_runs(**kw) -> (Result, out folder)``: the run of ``TIED`` updated by ``kw``,
    once per module for the tests that read it. Module-scoped, not the conftest's
    ``shared_run``: no other file runs these jobs, and ``shared_run`` would tie this
    file's runs to every other runtime file's on one xdist worker."""
    from perfsim.runtime import run

    done = {}

    def get(**kw):
        key = tuple(sorted(kw.items()))
        if key not in done:
            out = tmp_path_factory.mktemp("tied")
            done[key] = run(out=str(out), **{**TIED, **kw}), out
        return done[key]

    return get


def test_tied_head_is_one_model_on_one_or_two_stages(tied_runs):
    """pp=1 sums the two gradients in place, pp=2 all-reduces them between the stages:
    the same losses, the two copies equal after training -- and not the untied model."""
    one, out1 = tied_runs(pp=1)
    two, out2 = tied_runs(pp=2)
    untied = tied_runs(tied_embedding="untied", pp=2)[0]
    assert list(one.losses) == list(two.losses) == [0, 1, 2, 3]
    for s in one.losses:
        assert abs(one.losses[s] - two.losses[s]) < 1e-5
    assert abs(untied.losses[0] - two.losses[0]) > 1e-3  # the head starts as the embedding, not at random
    for out in (out1, out2):
        tok, head = _final_tables(out)
        assert torch.equal(tok, head)
    assert one.summary["tied_bytes"] == 0 and one.summary["tied_embedding"] == "sync"


@pytest.mark.parametrize("dp", [1, 2])
def test_tied_allreduce_sends_what_the_simulator_prices(tied_runs, dp):
    """One all-reduce of V x d fp32 values per replica between its first and last
    stage: the measured wire bytes are the prediction's ``tied_bytes``."""
    measured = tied_runs(pp=2, **({"dp": dp} if dp > 1 else {}))[0].summary
    pred = predict(model="gpt2-tiny", pp=2, dp=dp, micro_batch=4, macro_batch=8, bandwidth="1Gbps",
                   tied_embedding="sync").summary
    assert measured["tied_bytes"] == pred["tied_bytes"] == dp * 2 * 256 * 128 * 4
    assert measured["dp_sync_s"] > 0


def test_runtime_workload_carries_the_head_copy(tmp_path):
    """validate's workload file of the runtime's model names the head's copy, so the
    simulator prices the same all-reduce without the preset's architecture."""
    from perfsim.analysis.validate import runtime_workload

    path = runtime_workload("gpt2-tiny", tmp_path)
    assert json.loads(path.read_text())["tied_values"] == 256 * 128
    kw = dict(workload=str(path), pp=2, dp=1, micro_batch=4, macro_batch=8, bandwidth="100Mbps")
    synced, untied = predict(**kw, tied_embedding="sync").summary, predict(**kw).summary
    assert synced["tied_bytes"] == 2 * 256 * 128 * 4 and untied["tied_bytes"] == 0
    assert synced["iteration_s"] > untied["iteration_s"]


@pytest.mark.parametrize("tied, culprit", [(-1, "tied_values=-1"), (10**9, "tied_values=1000000000"),
                                           ("3", "tied_values='3'")])
def test_workload_file_tied_values_checked(write_file, tied, culprit):
    text = json.dumps({"name": "m", "tied_values": tied,
                       "layers": [{"params": 100, "out_shape": [4], "flops": 1.0}] * 3})
    with pytest.raises(ConfigError, match=culprit):
        load_workload_file(write_file("w.json", text))


@pytest.mark.parametrize("kw, culprit", [
    (dict(PINNED_JOB, tied_embedding="sync"), "no embedding"),
    (dict(PINNED_JOB, model="gpt2-tiny", tp=2, pp=1, tied_embedding="sync"), "tp > 1"),
    (dict(PINNED_JOB, model="gpt2-tiny", tied_embedding="shared"), "tied_embedding='shared'"),
])
def test_tied_embedding_refused_where_it_cannot_run(tmp_path, kw, culprit):
    with pytest.raises(ConfigError, match=culprit):
        make_config(out=tmp_path / "x", **kw)


def test_cli_names_a_bad_tied_embedding(tmp_path):
    proc = run_cli_here("run", "--out", str(tmp_path / "x"), *PINNED_FLAGS, "--tied-embedding", "sync")
    assert_user_error(proc.returncode, proc.stderr, "digits-mlp")


def test_checkpoint_before_the_flag_resumes_untied():
    """A checkpoint written before ``tied_embedding`` existed was untied: it resumes an
    untied run and refuses a tied one."""
    cfg = json.loads(RunConfig(**dict(PINNED_JOB, model="gpt2-tiny")).to_json())
    old = {"config": {k: v for k, v in cfg.items() if k != "tied_embedding"}}
    check_compatible(old, cfg, RunConfig.RESUME_KEYS, RunConfig.RESUME_DEFAULTS)
    with pytest.raises(ConfigError, match="tied_embedding"):
        check_compatible(old, dict(cfg, tied_embedding="sync"), RunConfig.RESUME_KEYS, RunConfig.RESUME_DEFAULTS)
