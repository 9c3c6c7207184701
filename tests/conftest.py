"""Fixtures shared by the test files.

Plain helper functions (running the CLI, spawning gloo ranks and their store, the checks every
compressor must pass) live in ``tests/_helpers.py``: worker functions that run in spawned
processes need them importable by name, which a conftest is not meant to be.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def write_file(tmp_path):
    """``write_file(name, text)``: a file ``name`` holding ``text`` in this test's temp dir."""

    def write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return write


@pytest.fixture(scope="session")
def shared_run(tmp_path_factory):
    """``shared_run(**params) -> (Result, out folder)``: :func:`perfsim.runtime.run` of
    ``params`` (in a folder of its own), run once per test session and shared by every test that asks for the
    same params -- only for tests that read the Result and its files, never change them.
    Each run starts real ranks (a torch import each): tests of different files that
    need the same job (a 1F1B reference, say) pay for it once."""
    from perfsim.runtime import run

    done = {}

    def get(**params):
        key = tuple(sorted((k, repr(v)) for k, v in params.items()))
        if key not in done:
            out = tmp_path_factory.mktemp("shared_run")
            done[key] = run(out=str(out), **params), out
        return done[key]

    return get



@pytest.fixture(scope="session")
def interference_run(tmp_path_factory):
    """``(records, stderr)``: :func:`perfsim.calibrate.comm.measure_comm` of the
    ``interference`` op on two real gloo ranks (compute alone, then under allreduces, in
    ``_helpers.INTERFERENCE_ROUNDS`` alternating windows), measured once per session, and
    what its ranks wrote on stderr (their file descriptor 2 is a file while they run):
    test_calibrate and test_fidelity read the same records (the tests check the records'
    shape and sign, not the statistic, so 3 windows instead of calibrate's 12; only reading
    tests may use it)."""
    import os

    from _helpers import INTERFERENCE_ROUNDS
    from perfsim.calibrate.comm import CommConfig, measure_comm

    err = tmp_path_factory.mktemp("interference") / "ranks.stderr"
    saved = os.dup(2)
    try:
        with open(err, "wb") as f:
            os.dup2(f.fileno(), 2)  # the spawned ranks inherit it
        records = measure_comm(CommConfig(ops=("interference",), sizes=(1024,), timeout_s=120,
                                          interference_rounds=INTERFERENCE_ROUNDS))
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    return records, err.read_text(errors="replace")


@pytest.fixture(scope="session")
def interference_records(interference_run):
    """The records of :func:`interference_run`."""
    return interference_run[0]


# ------------------------------------------------------------------ pytest-xdist
# `make test` runs the suite on 2 workers (``-n 2 --dist loadgroup``). A spawned run shared
# through a module- or session-scoped fixture of this folder must still happen once, so
# every test that shares such a fixture with another runs on the same worker; tests that
# share nothing are handed out one by one. (xdist's own loadgroup reads an
# ``xdist_group`` mark from a renamed test id, which pytest 9 no longer lets it set, so
# the groups travel in files: each worker writes the groups of what it collected, and
# the scheduler below reads them.)
GROUPS_ENV = "PERFSIM_TEST_GROUPS"


def pytest_configure(config):
    """In the controller of a distributed run: the folder the workers write groups into."""
    import os
    import shutil
    import tempfile

    if config.getoption("dist", "no") != "no" and not hasattr(config, "workerinput"):
        folder = tempfile.mkdtemp(prefix="perfsim-test-groups-")
        os.environ[GROUPS_ENV] = folder  # the workers, started later, inherit it
        config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, absent without it
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup``: :class:`xdist.scheduler.LoadScopeScheduling` whose scope of
    a test is its group (see :func:`pytest_collection_modifyitems`), else the test itself."""
    if config.getoption("dist") != "loadgroup":
        return None  # xdist's own
    import json
    import os

    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        groups: dict | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # every worker wrote its file before reporting its collection
                self.groups = {}
                for f in sorted(Path(os.environ[GROUPS_ENV]).glob("*.json")):
                    self.groups.update(json.loads(f.read_text()))
            return self.groups.get(nodeid, nodeid)

    return SharedFixtureScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """Group the tests that share an expensive fixture of this folder (module- or
    session-scoped: one spawned run, many assertions): a module-scoped fixture joins its
    module's tests, ``shared_run`` joins every file that asks for it, and tests joined by
    any fixture form one group. In an xdist worker the groups go to the scheduler's file."""
    import json
    import os

    here = Path(__file__).parent.resolve()
    parent: dict[str, str] = {}

    def find(key: str) -> str:
        while parent.setdefault(key, key) != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    keys_of = {}
    for item in items:
        keys = []
        for name, defs in getattr(item, "_fixtureinfo").name2fixturedefs.items():
            fdef = defs[-1]
            if fdef.scope == "function" or not _defined_here(fdef.func, here):
                continue
            keys.append(f"session:{name}" if fdef.scope == "session" else f"module:{item.path.name}")
        if keys:
            for k in keys[1:]:
                parent[find(k)] = find(keys[0])
            keys_of[item.nodeid] = keys[0]
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and GROUPS_ENV in os.environ:
        path = Path(os.environ[GROUPS_ENV]) / f"{worker}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({nodeid: find(key) for nodeid, key in keys_of.items()}))
        tmp.replace(path)


def _defined_here(func, here: Path) -> bool:
    import inspect

    try:
        return Path(inspect.getsourcefile(func)).resolve().is_relative_to(here)
    except TypeError:  # a builtin
        return False
