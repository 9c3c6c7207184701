"""One batch runner for ``perfsim plan`` and ``perfsim sweep``: a function mapped over
batches of configurations in this process, on a local process pool, or on Dask.

:class:`BatchRunner` is the only worker pool of perfsim. Its local pool

* forks (the workers need not import the caller's script, so a plain script without
  ``if __name__ == "__main__"`` works), unless torch is loaded: its OpenMP threads make
  forking unsafe, and then the batches run in this process (:func:`fork_context`);
* dies with its parent: each worker asks Linux for SIGKILL when the process that started
  it dies (:func:`perfsim.procs.die_with_parent`), so a SIGKILLed plan or sweep leaves no
  workers;
* keeps multiprocessing's temp folder (``pymp-*``) inside one named after this process
  (:data:`POOL_DIR_PREFIX` + pid), removed at exit; the folders of provably dead
  processes are removed when the next pool starts (:func:`remove_stale_pool_dirs`).

``backend="dask"`` (the optional extra ``perfsim[dask]``) uses Dask's local
multiprocessing scheduler with ``jobs`` workers, or a ``dask.distributed`` cluster
(``dask_scheduler``: its address, e.g. ``tcp://host:8786``) so a large search spreads
over its workers.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from perfsim.errors import ConfigError
from perfsim.procs import die_with_parent, provably_dead

if TYPE_CHECKING:  # pragma: no cover
    from concurrent.futures import ProcessPoolExecutor

log = logging.getLogger(__name__)

#: parallel backends (``process``: a local process pool)
BACKENDS = ("process", "dask")
#: the pool's temp folder in the system temp dir: this prefix, the pid, a random suffix
POOL_DIR_PREFIX = "perfsim-pool-"


def fork_context():
    """The ``fork`` context, or None where forking is unsafe (torch loaded) or missing."""
    import multiprocessing  # lazy: ~10 ms with its helpers: when a pool may start, not at CLI start-up

    if "torch" in sys.modules or "fork" not in multiprocessing.get_all_start_methods():
        return None
    return multiprocessing.get_context("fork")


def remove_stale_pool_dirs() -> None:
    """Remove the pool folders of processes that are provably dead (SIGKILLed):
    their workers died with them (``die_with_parent``), these remain."""
    base = Path(tempfile.gettempdir())
    for d in base.glob(f"{POOL_DIR_PREFIX}*"):
        try:
            pid = int(d.name[len(POOL_DIR_PREFIX):].split("-")[0])
            made = d.stat().st_mtime
        except (ValueError, OSError):
            continue
        if pid != os.getpid() and provably_dead(pid, made):
            shutil.rmtree(d, ignore_errors=True)


class BatchRunner:
    """Maps a function over batches: in this process (``jobs == 1``, or torch loaded),
    on a local process pool of ``jobs`` workers, or on Dask (module docstring). Use it
    as a context manager, or call :meth:`close`. ``fn`` and its arguments must be
    picklable (module-level functions) for a pool or Dask."""

    def __init__(self, jobs: int = 1, backend: str = "process", dask_scheduler: str | None = None):
        if backend not in BACKENDS:
            raise ConfigError(f"backend={backend!r}: choose from {', '.join(BACKENDS)}")
        if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
            raise ConfigError(f"jobs={jobs!r}: must be an integer >= 1")
        self.backend, self.jobs = backend, jobs
        self.pool: ProcessPoolExecutor | None = None
        self.client = None
        self._context = None
        if backend == "dask":
            if importlib.util.find_spec("dask") is None:
                raise ConfigError("backend=dask: dask is not installed (pip install 'perfsim[dask]')")
            if dask_scheduler:
                try:
                    from distributed import Client  # lazy: optional extra (perfsim[dask])
                except ImportError:
                    raise ConfigError("dask_scheduler: needs dask.distributed (pip install 'perfsim[dask]')") from None
                try:
                    self.client = Client(dask_scheduler, timeout="10s")
                except (OSError, TimeoutError) as exc:
                    raise ConfigError(f"dask_scheduler={dask_scheduler!r}: cannot connect ({exc})") from None
                self.jobs = max(jobs, sum(self.client.nthreads().values()))
        elif dask_scheduler:
            raise ConfigError("dask_scheduler: only with backend=dask")
        elif jobs > 1:
            self._context = fork_context()
            if self._context is None:
                log.debug("torch is loaded in this process (forking is unsafe): running in-process")

    @property
    def parallel(self) -> bool:
        """Whether batches run in other processes."""
        if self.backend == "dask":
            return self.client is not None or self.jobs > 1
        return self._context is not None

    def _start_pool(self) -> ProcessPoolExecutor:
        import multiprocessing.util  # lazy: as in fork_context, not at CLI start-up
        from concurrent.futures import ProcessPoolExecutor  # lazy: as multiprocessing

        if self.pool is None:
            remove_stale_pool_dirs()
            own = tempfile.mkdtemp(prefix=f"{POOL_DIR_PREFIX}{os.getpid()}-")
            # at exit, after multiprocessing removed its pymp-* (exitpriority -100)
            multiprocessing.util.Finalize(None, shutil.rmtree, args=(own, True), exitpriority=-101)
            saved, tempfile.tempdir = tempfile.tempdir, own
            try:
                self.pool = ProcessPoolExecutor(max_workers=self.jobs, mp_context=self._context,
                                                initializer=die_with_parent)
            finally:
                tempfile.tempdir = saved
        return self.pool

    def map(self, fn: Callable[..., Any], batches: Sequence[Any], *args: Any) -> list:
        """``[fn(batch, *args) for batch in batches]``, in order, computed in parallel where
        the runner is."""
        if self.client is not None:
            return self.client.gather(self.client.map(fn, batches, *([a] * len(batches) for a in args),
                                                      pure=False))
        if self.backend == "dask" and self.jobs > 1:
            import dask  # optional extra  # lazy: dask is heavy, needed only here

            tasks = [dask.delayed(fn)(b, *args) for b in batches]
            return list(dask.compute(*tasks, scheduler="processes", num_workers=self.jobs))
        if self.parallel:
            pool = self._start_pool()
            return [f.result() for f in [pool.submit(fn, b, *args) for b in batches]]
        return [fn(b, *args) for b in batches]

    def as_completed(self, fn: Callable[..., Any], batches: Sequence[Any], *args: Any) -> Iterator[Any]:
        """``fn(batch, *args)`` for every batch, yielded as each finishes (a local pool) or in
        order; leaving the loop early cancels the batches not started."""
        if not (self.backend == "process" and self.parallel):
            if self.backend == "dask":
                yield from self.map(fn, batches, *args)
            else:
                for b in batches:
                    yield fn(b, *args)
            return
        from concurrent.futures import FIRST_COMPLETED, wait  # lazy: loaded by _start_pool already

        pool = self._start_pool()
        pending = {pool.submit(fn, b, *args) for b in batches}
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    yield fut.result()
        finally:
            for fut in pending:
                fut.cancel()

    def close(self) -> None:
        """Stop the workers (waits for running batches; cancels queued ones)."""
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None
        if self.client is not None:
            self.client.close()
            self.client = None

    def __enter__(self) -> "BatchRunner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
