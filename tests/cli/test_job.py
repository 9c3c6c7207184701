"""One description of a job (issue 38): the simulator's Strategy and execute mode's RunConfig
are both a :class:`perfsim.job.Job`, so ``perfsim run`` and ``perfsim predict`` given the same
flags train and simulate the same job."""

from __future__ import annotations

import dataclasses
import re

import pytest

from perfsim.config import Strategy
from perfsim.errors import ConfigError
from perfsim.job import JOB_FIELDS, MEGATRON, PERFSIM, Job
from perfsim.runtime.config import RunConfig

from _helpers import assert_user_error, run_cli_here

#: flag sets a user gives both commands (the placement and the device order are the job's:
#: both engines number their ranks along them)
FLAG_SETS = [
    ["--model", "gpt2-tiny", "--pp", "2"],
    ["--model", "gpt2-tiny", "--pp", "2", "--dp", "2"],
    ["--model", "gpt2-tiny", "--pp", "1", "--tp", "2"],
    ["--model", "gpt2-tiny", "--pp", "2", "--tp", "2", "--sequence-parallel"],
    ["--model", "gpt2-tiny", "--pp", "2", "--schedule", "1f1b"],
    ["--model", "gpt2-tiny", "--pp", "2", "--schedule", "interleaved-1f1b"],
    ["--model", "gpt2-tiny", "--pp", "2", "--schedule", "interleaved-1f1b", "--virtual-stages", "3"],
    ["--model", "gpt2-tiny", "--pp", "2", "--schedule", "zb-v", "--virtual-stages", "3"],  # zb-v runs its own 2
    ["--model", "gpt2-tiny", "--pp", "2", "--schedule", "1f1b", "--virtual-stages", "2"],
    ["--model", "gpt2-tiny", "--pp", "2", "--schedule", "zb-v", "--micro-batch", "2"],
    ["--model", "gpt2-tiny", "--pp", "2", "--dp", "2", "--compress", "aqsgd:fw3bw6",
     "--grad-compress", "qsgd-maxnorm:4"],
    ["--model", "gpt2-tiny", "--pp", "3", "--boundary-compress", "1=directq:fw4bw8"],
    ["--model", "gpt2-tiny", "--pp", "2", "--micro-batch", "4", "--macro-batch", "16", "--partition", "2,4"],
    ["--model", "gpt2-tiny", "--pp", "2", "--partition", "uniform"],
    ["--model", "gpt2-tiny", "--pp", "2", "--device-order", "1,0"],
    ["--model", "gpt2-tiny", "--pp", "2", "--dp", "2", "--device-order", "3,1,2,0"],
    ["--model", "gpt2-tiny", "--pp", "2", "--dp", "2", "--tp", "2", "--placement", "tp,dp,pp"],
    ["--model", "gpt2-tiny", "--pp", "2", "--tied-embedding", "sync"],
    ["--model", "gpt2-tiny", "--pp", "1", "--dp", "2", "--zero", "3"],
    ["--model", "gpt2-tiny", "--pp", "2", "--optimizer", "sgd"],
    ["--model", "gpt2-small-byte"],  # only the model: both commands' defaults
]


def _subparser(name: str):
    import argparse

    from perfsim.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _run_job(argv: list[str], tmp_path) -> RunConfig:
    """The RunConfig ``perfsim run ARGV`` trains (parsed by the command, built by make_config,
    nothing launched)."""
    from perfsim.commands.run import run_params
    from perfsim.runtime import make_config

    params = run_params(_subparser("run").parse_args([*argv, "--out", str(tmp_path / "run")]))
    return make_config(**params)


def _predict_job(argv: list[str]) -> Strategy:
    """The Strategy ``perfsim predict ARGV`` simulates (its one grid row)."""
    from perfsim import params
    from perfsim.api import build_configs

    rows = params.expand(params.grid(params.from_args(_subparser("predict").parse_args(argv)), cli=True))
    assert len(rows) == 1
    return build_configs(**rows[0])[1]


@pytest.mark.parametrize("argv", FLAG_SETS, ids=[" ".join(a[2:]) or a[1] for a in FLAG_SETS])
def test_the_same_flags_are_the_same_job_in_run_and_predict(argv, tmp_path):
    ran, predicted = _run_job(argv, tmp_path), _predict_job(argv)
    assert ran.model == predicted_model(argv)
    for name in JOB_FIELDS:  # every shared field, one by one: the message names the one that differs
        assert getattr(ran, name) == getattr(predicted, name), name
    assert ran.job() == predicted.job()
    assert ran.table() == predicted.table()  # the same schedule table (both engines replay it)


def predicted_model(argv: list[str]) -> str:
    return argv[argv.index("--model") + 1]


def test_run_defaults_are_predicts(tmp_path):
    """Before issue 38 ``perfsim run --model gpt2-tiny --pp 2`` trained micro-batches of 8 with
    1F1B and ``perfsim predict`` the same flags micro-batches of 1 with GPipe."""
    ran = _run_job(["--model", "gpt2-tiny", "--pp", "2"], tmp_path)
    assert (ran.micro_batch, ran.macro_batch, ran.schedule) == (1, 32, "gpipe")
    assert _run_job([], tmp_path / "none").job() == Job()  # no flags at all: the job's defaults
    assert RunConfig().model == "gpt2-small-byte" and len(RunConfig().stage_ranges()) == Job().pp


def test_a_run_model_too_shallow_for_the_default_pp_names_the_flag(tmp_path):
    r = run_cli_here("run", "--model", "digits-mlp", "--out", str(tmp_path / "x"))
    assert_user_error(r.returncode, r.stderr, "pp=8")  # digits-mlp: 4 layers, pp 8 by default
    assert not (tmp_path / "x").exists()


def test_no_job_field_is_declared_twice():
    """Strategy and RunConfig inherit the job's fields (the very Field objects: one default,
    one type); each adds only its own."""
    job = Job.__dataclass_fields__
    for cls in (Strategy, RunConfig):
        own = cls.__dataclass_fields__
        for name in JOB_FIELDS:
            assert own[name] is job[name], (cls.__name__, name)
        assert issubclass(cls, Job)
    assert tuple(f.name for f in dataclasses.fields(Job)) == JOB_FIELDS


@pytest.mark.parametrize("kw, culprit", [
    (dict(pp=0), "pp=0"),
    (dict(micro_batch=3), "macro_batch=32: not divisible by micro_batch=3"),
    (dict(sequence_parallel=True), "sequence_parallel: needs tp > 1"),
    (dict(tied_embedding="shared"), "tied_embedding='shared'"),
    (dict(zero=4), "zero=4"),
    (dict(schedule="pipedream"), "schedule='pipedream'"),
    (dict(device_order=(0, 0)), "device_order='0,0'"),
    (dict(pp=2, partition=(3,)), "partition=(3,)"),
    (dict(pp=2, boundary_compress="5=fp16"), "boundary 5"),
    (dict(optimizer="lamb"), "optimizer='lamb': choose from adamw, sgd"),
    (dict(optimizer="sgd", grad_compress="onebit-adam"), "optimizer='sgd' with grad_compress='onebit-adam'"),
    (dict(pp=1, dp=2, zero=2, offload="optimizer", optimizer="sgd"), "offload='optimizer' with optimizer='sgd'"),
])
def test_one_validation_for_both(kw, culprit):
    """The job's checks are one: Strategy and RunConfig refuse the same values with the same line."""
    for cls, extra in ((Job, {}), (Strategy, {}), (RunConfig, {"model": "gpt2-small-byte"})):
        with pytest.raises(ConfigError, match=re.escape(culprit)) as err:
            cls(**kw, **extra)
        assert "\n" not in str(err.value)


def test_value_types_are_parsed_once():
    """device_order and partition are tuples of ints in both classes (a rank's JSON config
    turns back into the same value)."""
    cfg = RunConfig(model="gpt2-tiny", pp=2, device_order=(1, 0), partition=(2, 4))
    import json

    again = RunConfig.from_dict(json.loads(cfg.to_json()))
    assert again == cfg and again.device_order == (1, 0) and again.partition == (2, 4)


def test_one_check_tp_for_predict_and_run(tmp_path):
    """A tensor-parallel degree the model cannot take is refused by predict and run with the
    same line (perfsim.models.tensor_parallel.check_tp)."""
    from perfsim.api import predict
    from perfsim.runtime import make_config

    with pytest.raises(ConfigError) as sim:
        predict(model="gpt2-tiny", pp=1, tp=3, gpu="a100")
    with pytest.raises(ConfigError) as run:
        make_config(model="gpt2-tiny", pp=1, tp=3, out=str(tmp_path / "r"))
    assert str(sim.value) == str(run.value) == "tp=3: does not divide gpt2-tiny heads=4"
    with pytest.raises(ConfigError, match="GPT"):
        make_config(model="digits-mlp", pp=2, tp=2, out=str(tmp_path / "r"))


def test_gpu_selects_the_megatron_preset():
    from perfsim.api import build_configs
    from perfsim.partition import uniform_counts
    from perfsim.workload import get_model

    names = [layer.name for layer in get_model("gpt2-tiny").layers]
    for gpu, preset in ((None, PERFSIM), ("a100", MEGATRON)):
        _, s, _, _ = build_configs(model="gpt2-tiny", pp=2, gpu=gpu)
        assert (s.schedule, s.grad_buffer, s.tied_embedding, s.overlap_grad_sync, ",".join(s.placement)) == \
            (preset.schedule, preset.grad_buffer, preset.tied_embedding, preset.overlap, preset.placement)
        assert s.partition == (uniform_counts(names, 2) if preset.partition == "uniform" else None)
    assert MEGATRON.schedule == "1f1b" and MEGATRON.placement == "tp,dp,pp" and MEGATRON.overlap is False
    _, s, _, _ = build_configs(model="gpt2-tiny", pp=2, gpu="a100", schedule="gpipe", tied_embedding="untied")
    assert (s.schedule, s.tied_embedding) == ("gpipe", "untied")  # a flag given wins over the preset


@pytest.mark.parametrize("placement", [None, "tp,dp,pp", "dp,tp,pp"])
def test_predict_and_run_put_the_same_ranks_in_the_same_groups(placement, tmp_path):
    """tp2 x pp2 x dp2: the simulator's GPUs and the runtime's ranks -- its data-parallel
    process groups and its TP device mesh -- are numbered by one definition
    (:func:`perfsim.job.place`, along the job's placement)."""
    import itertools

    import numpy as np

    argv = ["--model", "gpt2-tiny", "--pp", "2", "--dp", "2", "--tp", "2",
            *(["--placement", placement] if placement else [])]
    ran, predicted = _run_job(argv, tmp_path), _predict_job(argv)
    assert ran.placement == predicted.placement == tuple((placement or "tp,pp,dp").split(","))
    layout = ran.layout
    for t, r, s in itertools.product(range(2), repeat=3):
        assert layout.rank(s, r, t) == predicted.device(t, r, s)  # (RunConfig.device: cpu or cuda)
        assert layout.coords(layout.rank(s, r, t)) == (s, r, t)

    def groups(device, dim):  # the rank sets along one dimension, the others fixed
        axes = {"tp": 0, "dp": 1, "pp": 2}
        out = set()
        for fixed in itertools.product(range(2), repeat=2):
            members = []
            for i in range(2):
                c = list(fixed)
                c.insert(axes[dim], i)
                members.append(device(*c))
            out.add(tuple(sorted(members)))
        return out

    shape, names = layout.mesh_dims()
    mesh = np.arange(8).reshape(shape)  # init_device_mesh numbers its ranks row-major

    def mesh_groups(dim):
        return {tuple(sorted(g)) for g in np.moveaxis(mesh, names.index(dim), -1).reshape(-1, 2).tolist()}

    for dim in ("tp", "dp", "pp"):
        simulated = groups(predicted.device, dim)
        assert groups(lambda t, r, s: layout.rank(s, r, t), dim) == simulated, dim
        assert mesh_groups(dim) == simulated, dim
    assert {tuple(sorted(g)) for g in layout.dp_group_ranks()} == groups(predicted.device, "dp")


def test_validate_grid_defaults_are_the_jobs_but_named_changes():
    """perfsim validate's job defaults come from the Job (predict's and run's); what a grid
    changes is named once (validate_grid.GRID_JOB), never a second literal beside the Job's."""
    import inspect

    from perfsim.analysis.validate_grid import GRID_JOB, validate
    from perfsim.commands.validate import JOB as VALIDATE_JOB

    defaults = {k: p.default for k, p in inspect.signature(validate).parameters.items()}
    assert set(GRID_JOB) <= set(VALIDATE_JOB) and set(VALIDATE_JOB) - {"model"} <= set(JOB_FIELDS)
    for name in VALIDATE_JOB:
        given = defaults[name][0] if isinstance(defaults[name], tuple) else defaults[name]
        assert given == GRID_JOB.get(name, getattr(Job, name, None)), name
    assert [name for name in VALIDATE_JOB if name not in GRID_JOB and name != "model"]  # the rest: the Job's


@pytest.mark.parametrize("command", ["predict", "run", "memory", "plan"])
def test_an_unknown_optimizer_is_one_line_exit_2(command, tmp_path):
    """--optimizer is one parameter (perfsim.params.PARAMS) of every command that takes the job."""
    extra = ["--out", str(tmp_path / "r")] if command == "run" else []
    r = run_cli_here(command, "--model", "gpt2-tiny", "--pp", "2", "--optimizer", "lamb", *extra)
    assert_user_error(r.returncode, r.stderr, "optimizer='lamb': choose from adamw, sgd")


def test_plan_pins_the_optimizer_and_emits_it():
    """perfsim plan takes --optimizer as one pinned value (a comma list is refused: the
    convergence curves it ranks by are the default optimizer's) and its winner's run and
    Megatron-LM commands carry it."""
    from perfsim.emit import megatron_args, run_command

    from perfsim.plan import plan

    res = plan(model="gpt2-tiny", nodes=2, bandwidth="100Mbps", global_batch=32, optimizer="sgd",
               profile="traces/cpu-2core.json", compress="fp32", grad_compress="none", schedule="gpipe")
    assert {row["optimizer"] for row in res.rows()} == {"sgd"}
    best = res.ranked[0].params
    assert "--optimizer sgd" in run_command(best)
    assert megatron_args(best, 32)[0][-4:] == ["--optimizer", "sgd", "--sgd-momentum", "0.9"]
    assert "--optimizer" not in run_command({**best, "optimizer": "adamw"})
    with pytest.raises(ConfigError, match="takes one value"):
        plan(model="gpt2-tiny", nodes=2, bandwidth="100Mbps", global_batch=32, optimizer="adamw,sgd")


#: (model and job flags, run's own data flags, predict's): one --epochs meaning in both commands
EPOCH_CASES = [
    (["--model", "gpt2-tiny", "--pp", "2"], [], []),  # the pydoc corpus: 7285 windows of 128 bytes
    (["--model", "digits-mlp", "--pp", "2", "--dp", "2"], [], []),  # 1797 digits, global batch 64
    (["--model", "digits-mlp", "--pp", "1", "--macro-batch", "48"], ["--dataset-limit", "100"],
     ["--dataset-samples", "100"]),  # a shortened epoch: 100 samples, the last batch padded
]


@pytest.mark.parametrize("job, run_only, predict_only", EPOCH_CASES, ids=[" ".join(c[0][1:]) for c in EPOCH_CASES])
@pytest.mark.parametrize("epochs", [1, 3])
def test_run_and_predict_epochs_are_the_same_optimizer_steps(job, run_only, predict_only, epochs, tmp_path):
    """``perfsim run --epochs E`` trains the steps ``perfsim predict --epochs E`` prices: the data
    set's size is the model's own in both (perfsim.models.datasets), an epoch is
    ceil(samples / global batch) steps in both (perfsim.job.training_steps). The run's count is
    the worker's own (its data set, its sample order, its total_steps)."""
    from perfsim import params, predict
    from perfsim.models.registry import get_model_spec
    from perfsim.runtime.data import Order, dataset_for
    from perfsim.runtime.worker import total_steps

    cfg = _run_job([*job, *run_only, "--epochs", str(epochs)], tmp_path)
    order = Order(len(dataset_for(get_model_spec(cfg.model), cfg.dataset_limit)), cfg.global_batch, cfg.seed)
    ran = total_steps(cfg, order.num_samples)
    assert ran == epochs * order.steps_per_epoch
    row, = params.expand(params.grid(params.from_args(
        _subparser("predict").parse_args([*job, *predict_only, "--epochs", str(epochs)])), cli=True))
    s = predict(**row).summary
    assert (s["optimizer_steps"], s["iterations_per_epoch"], s["dataset_samples"]) == \
        (ran, order.steps_per_epoch, order.num_samples)


def test_dataset_samples_default_is_the_models_data_set_else_2359():
    from perfsim import predict

    assert predict(model="digits-mlp", pp=2).summary["dataset_samples"] == 1797
    assert predict(model="gpt2-tiny", pp=2, dataset_samples=500).summary["dataset_samples"] == 500  # given: wins
    assert predict().summary["dataset_samples"] == Strategy.dataset_samples == 2359  # gpt2-xl: no data set known


@pytest.mark.parametrize("command, value", [("predict", "0"), ("predict", "1.5"), ("run", "0"), ("run", "-1"),
                                            ("run", "inf")])
def test_epochs_must_be_a_positive_integer_in_both(command, value, tmp_path):
    extra = ["--out", str(tmp_path / "r")] if command == "run" else []
    r = run_cli_here(command, "--model", "digits-mlp", "--pp", "2", "--epochs", value, *extra)
    assert_user_error(r.returncode, r.stderr, "epochs")
    with pytest.raises(ConfigError, match=re.escape("epochs=0: must be an integer >= 1")):
        RunConfig(model="digits-mlp", pp=2, epochs=0)
    with pytest.raises(ConfigError, match=re.escape("epochs=0.5: must be an integer >= 1")):
        Strategy(epochs=0.5)


@pytest.mark.parametrize("command", ["predict", "run"])
def test_a_one_bit_optimizer_with_sgd_is_one_line_exit_2(command, tmp_path):
    """A 1-bit optimizer is an Adam (or LAMB) itself: --optimizer sgd beside it is refused before
    anything runs (run's 1-bit header is not printed first)."""
    extra = ["--out", str(tmp_path / "r")] if command == "run" else []
    r = run_cli_here(command, "--model", "digits-mlp", "--pp", "1", "--dp", "2", "--optimizer", "sgd",
                     "--grad-compress", "onebit-adam", *extra)
    assert_user_error(r.returncode, r.stderr, "optimizer='sgd' with grad_compress='onebit-adam'")
    assert not (tmp_path / "r").exists()


def test_a_checkpoint_of_a_float_epochs_run_resumes():
    """``--epochs`` was a float before it meant whole epochs in both commands: a checkpoint's
    stored ``2.0`` is read as 2 (a fractional one is refused by RunConfig in one line)."""
    from perfsim.runtime._entry import _stored_config

    assert _stored_config({"epochs": 2.0, "steps": None}) == {"epochs": 2, "steps": None}
    assert isinstance(_stored_config({"epochs": 2.0})["epochs"], int)
    assert _stored_config({"epochs": 0.5}) == {"epochs": 0.5}
