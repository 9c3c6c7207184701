"""Helpers shared by the tests and by the worker functions they spawn.

A plain module, not ``conftest.py``: ``torch.multiprocessing`` children unpickle a
worker by importing its test module, and that module imports these by name
(pytest puts ``tests/`` on ``sys.path``; spawned children inherit it).
"""

from __future__ import annotations

import contextlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import torch

from perfsim import rank_store
from perfsim.compression import make_compressor


def load_script(name: str):
    """``scripts/<name>.py`` of this checkout as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ------------------------------------------------------------------ processes
# A short digits-mlp pipeline job (2 steps per epoch: AQ-SGD compresses from step 2) that
# several test files run with different pp / schedule / compress; with the conftest's
# ``shared_run`` equal jobs run once.
PIPE_JOB = dict(model="digits-mlp", micro_batch=4, macro_batch=16, steps=6, dataset_limit=32, timeout="60s")
#: the job the runtime tests were written for: ``perfsim run``'s defaults before issue 38 gave
#: run and predict one job description (whose defaults, predict's, are pp 8, micro-batches of
#: 1, GPipe, and for run the model gpt2-small-byte); a test that relied on them pins them
PINNED_JOB = dict(model="digits-mlp", pp=2, micro_batch=8, schedule="1f1b")
PINNED_FLAGS = ["--model", "digits-mlp", "--pp", "2", "--micro-batch", "8", "--schedule", "1f1b"]
#: alternating windows of the conftest's ``interference_records`` measurement (calibrate takes
#: perfsim.calibrate.interference.ROUNDS = 12; what the tests check needs no more than a few)
INTERFERENCE_ROUNDS = 3
#: seconds a spawned rank waits for its peers (the store, a collective) before it fails
RANK_TIMEOUT_S = 600.0


def run_cli(*args: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    """``python -m perfsim ARGS`` in a fresh interpreter, text output captured."""
    return subprocess.run([sys.executable, "-m", "perfsim", *args], capture_output=True, text=True,
                          timeout=timeout, **kw)


def run_cli_here(*args: str) -> subprocess.CompletedProcess:
    """``perfsim ARGS`` through :func:`perfsim.cli.main` in this process, output captured:
    what :func:`run_cli` gives without starting an interpreter (and torch) per call. For
    tables of user mistakes whose first row still goes through :func:`run_cli`. The
    ``perfsim`` logger is left as it was."""
    import io
    import logging

    from perfsim.cli import main

    log = logging.getLogger("perfsim")
    handlers, level = list(log.handlers), log.level
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:  # argparse's own errors
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        log.handlers[:], log.level = handlers, level
    return subprocess.CompletedProcess(["perfsim", *args], code, out.getvalue(), err.getvalue())


def assert_user_error(code: int, err: str, culprit: str) -> None:
    """The house rule for a user mistake: exit 2, one line naming ``culprit``, no traceback."""
    assert code == 2, err
    assert "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and culprit in err, err


def run_then_exit(rank: int, fn, *args) -> None:
    """``fn(rank, *args)`` in a spawned rank, then leave without interpreter finalization
    (:func:`perfsim.procs.exit_rank`): gloo threads still holding finished work can
    otherwise abort a rank that did all its work (SIGABRT at exit, seen in a fresh-venv
    run of test_onebit_optim). An exception still reaches the parent as a failure."""
    from perfsim.procs import exit_rank

    fn(rank, *args)
    exit_rank(0)


#: what the forkserver of :func:`spawn_ranks` imports once, so that a rank need not (torch and
#: torch._dynamo, which torch.optim imports, cost a new interpreter ~2.5 CPU-s; as the runtime's
#: rank zygote, perfsim/runtime/zygote.py, the server runs no torch operation before it forks)
RANK_PRELOAD = ["torch", "torch._dynamo", "torch.distributed", "torch.nn.parallel", "_helpers", "perfsim.ddp"]


def spawn_ranks(fn, *args, world: int = 2, start_method: str = "forkserver") -> None:
    """Run ``fn(rank, port, *args)`` in ``world`` new processes; ``port`` is that of the
    rendezvous store this process serves for them while they run
    (:func:`perfsim.rank_store.hosted`, bound as created: no window in which another process
    could take it), which :func:`gloo_group` joins. Returns when all have finished; a rank's
    exception fails the call.

    ``forkserver`` (the default): each rank is forked from one server per test process
    that imported :data:`RANK_PRELOAD` when it started -- a fresh interpreter's state, not
    the test process's (its threads, its torch pools), and the test's working directory and
    ``sys.path``, but the environment of the server's start: a worker must not read
    variables a test sets (use ``spawn`` for that)."""
    import torch.multiprocessing as mp

    if start_method == "forkserver":
        mp.get_context("forkserver").set_forkserver_preload(RANK_PRELOAD)  # read when it starts
    with rank_store.hosted(world, RANK_TIMEOUT_S) as host:
        mp.start_processes(run_then_exit, args=(fn, host.port, *args), nprocs=world, join=True,
                           start_method=start_method)


def save_rank(out_dir, rank: int, obj) -> None:
    """What rank ``rank`` saw, for the parent to check (see :func:`load_ranks`)."""
    torch.save(obj, Path(out_dir) / f"rank{rank}.pt")


def load_ranks(out_dir, world: int) -> list:
    """Every rank's :func:`save_rank` object, in rank order."""
    return [torch.load(Path(out_dir) / f"rank{r}.pt", weights_only=False) for r in range(world)]


def run_ranks(fn, out_dir, *args, world: int = 2, start_method: str = "forkserver") -> list:
    """:func:`spawn_ranks` of ``fn(rank, port, *args, out_dir)``; returns what each rank
    saved there with :func:`save_rank`, in rank order."""
    spawn_ranks(fn, *args, str(out_dir), world=world, start_method=start_method)
    return load_ranks(out_dir, world)


def convergence_table(out_dir, steps: int, only: list[str] | None, onebit: bool) -> dict[str, dict]:
    """scripts/ddp_convergence.py's table (config -> CSV row) of the configs ``only`` (and
    their baselines; all when None), with or without the 1-bit optimizers: the script's own
    ``configs``, ``train_all`` and ``write`` in two forkserver ranks (:func:`spawn_ranks`)
    instead of a torchrun job of three new interpreters."""
    import csv

    spawn_ranks(_convergence_rank, steps, only, onebit, str(out_dir))
    with open(Path(out_dir) / "ddp_convergence.csv") as f:
        return {r["config"]: r for r in csv.DictReader(f)}


def above_2x(table: dict[str, dict]) -> dict[str, float]:
    """The configs of a :func:`convergence_table` whose final loss is above twice their
    baseline's (NaN counts), ratio rounded: what the convergence tests require empty."""
    ratios = {k: float(r["ratio"]) for k, r in table.items()}
    return {k: round(v, 2) for k, v in ratios.items() if not v <= 2.0}


def _convergence_rank(rank: int, port: int, steps: int, only, onebit: bool, out_dir: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import ddp_convergence as conv

    cfgs = conv.configs(steps, onebit=onebit)
    with gloo_group(rank, 2, port):
        curves, sent = conv.train_all(steps, only, cfgs)
    if rank == 0:
        conv.write(Path(out_dir), curves, sent, cfgs, plot=False)


@contextlib.contextmanager
def gloo_group(rank: int, world: int, port: int | None = None):
    """A gloo process group for the body (one thread per rank), over the store at
    127.0.0.1:``port`` (:func:`spawn_ranks`'s); ``port`` None: a one-rank group in this
    process, over a store of its own. On success the ranks meet at a barrier first, so none
    tears gloo down while its peer is mid-collective; on an exception the group is torn
    down at once."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    if port is None:
        if world != 1:
            raise ValueError(f"gloo_group: world {world} needs the port of spawn_ranks' store")
        store = rank_store.serve("127.0.0.1", 1, RANK_TIMEOUT_S)
    else:
        store = rank_store.join("127.0.0.1", port, world, RANK_TIMEOUT_S)
    rank_store.init_group("gloo", rank, world, RANK_TIMEOUT_S, store)
    try:
        yield
        dist.barrier()
    finally:
        dist.destroy_process_group()


def same_state(a, b) -> bool:
    """Whether two (nested dict / list / tensor) states are equal, tensors bit for bit."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    return a == b


# ------------------------------------------------------------------ compressors
def assert_payload_is_wire_size(spec: str, shape: tuple[int, ...]) -> None:
    """Compress a random ``shape`` tensor with ``spec``: the payload's bytes must be what
    ``wire_bytes`` (the simulator's figure) says, and decompressing must give back the
    shape and dtype."""
    c = make_compressor(spec)
    x = torch.randn(shape)
    p = c.compress(x)
    assert p.nbytes == c.wire_bytes(shape), (spec, shape)
    y = c.decompress(p)
    assert y.shape == x.shape and y.dtype == x.dtype, (spec, shape)


def assert_resumes_from_state(spec: str, x: torch.Tensor, seed: int) -> dict:
    """A compressor restored from ``state_dict()`` taken after one call produces the same
    next payload (and decoding) as the one it was taken from. Returns that state."""
    a = make_compressor(spec, seed=seed)
    a.compress(x)
    state = a.state_dict()
    nxt = a.compress(x)
    b = make_compressor(spec, seed=seed)
    b.load_state_dict(state)
    again = b.compress(x)
    assert nxt.meta == again.meta, spec
    assert set(nxt.tensors) == set(again.tensors), spec
    assert all(torch.equal(nxt.tensors[k], again.tensors[k]) for k in nxt.tensors), spec
    assert torch.equal(a.decompress(nxt), b.decompress(again)), spec
    return state


def transformers_param_count(model_type: str, fields: dict, min_major: int = 4) -> int:
    """Parameters transformers builds for a config of ``model_type`` with ``fields`` on the meta device
    (the model-size tests' independent count); skips where transformers (at least version ``min_major``)
    is not installed -- it is not among ``make test``'s pins."""
    import pytest

    transformers = pytest.importorskip("transformers")
    if int(transformers.__version__.split(".")[0]) < min_major:
        pytest.skip(f"transformers {transformers.__version__} predates {model_type}'s field names")
    config = transformers.AutoConfig.for_model(model_type, **fields)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())
