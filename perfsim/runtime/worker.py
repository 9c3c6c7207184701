"""One rank of a ``perfsim run`` job: ``python -m perfsim.runtime.worker CONFIG.json``.

Reads the standard torch.distributed environment (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``; set by :mod:`perfsim.runtime.launch` or by
``torchrun``; :func:`perfsim.rank_store.init_group` joins the store the launcher
serves), builds its stage, trains, checkpoints, and sends its records to
rank 0, which writes the measured :class:`perfsim.result.Result`.

Rank layout: the job's placement, as the simulator numbers its devices
(:class:`perfsim.runtime.layout.RankLayout`); a rank holds the stages
(model chunks) the schedule table puts on its pipeline device, and with
``tp > 1`` each chunk's blocks are sharded by :mod:`perfsim.runtime.tensor_parallel`.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

from perfsim import ddp as pddp
from perfsim import rank_store
from perfsim.compression import make_pipeline_pair
from perfsim.compression.aqsgd_store import snapshot_into
from perfsim.errors import ConfigError
from perfsim.job import training_steps
from perfsim.models.registry import get_model_spec
from perfsim.procs import die_with_parent
from perfsim.result import atomic_write_text
from perfsim.runtime import checkpoint
from perfsim.runtime.config import RunConfig
from perfsim.runtime.data import Order, dataset_for
from perfsim.runtime.fsdp import CollectiveMeter, shard_stage
from perfsim.runtime.launch import HEARTBEAT_PERIOD_S, TrainingDiverged
from perfsim.runtime.measure import build_result, results_written, write_outputs
from perfsim.runtime.models import Stage
from perfsim.runtime.pipeline import StageRunner
from perfsim.runtime.tensor_parallel import TensorParallel
from perfsim.runtime.tied import TiedEmbedding
from perfsim.schedules import max_in_flight

COMPRESSOR_SLOTS = ("fw_send", "fw_recv", "bw_send", "bw_recv")


def boundary_seed(seed: int, boundary: int, direction: int) -> int:
    """Seed shared by both sides of pipeline boundary ``boundary`` (after stage
    ``boundary``) for direction 0 = forward, 1 = backward."""
    return (int(seed) * 1_000_003 + 2 * boundary + direction) % 2**31


def make_stage_compressors(cfg: RunConfig, stage: int, table=None) -> dict:
    """The compressors of a stage: sending/receiving, forward/backward, for each
    boundary that crosses ranks, with that boundary's spec (``cfg.boundary_compress``
    over ``cfg.compress``, :mod:`perfsim.boundaries`) (``table``'s stage-to-device map; None: one stage
    per rank)."""
    out = {}
    n = table.num_stages if table is not None else cfg.pp
    where = table.stage_device if table is not None else range(n)

    def pair(boundary: int, direction: int):  # both sides of a boundary build the same pair
        spec = cfg.boundary_compress.get(boundary, cfg.compress)
        return make_pipeline_pair(spec, seed=boundary_seed(cfg.seed, boundary, direction))

    if stage < n - 1 and where[stage + 1] != where[stage]:  # boundary `stage` with the next stage
        out["fw_send"] = pair(stage, 0)[0]
        out["bw_recv"] = pair(stage, 1)[1]
    if stage > 0 and where[stage - 1] != where[stage]:  # boundary `stage-1` with the previous stage
        out["fw_recv"] = pair(stage - 1, 0)[0]
        out["bw_send"] = pair(stage - 1, 1)[1]
    return out


def total_steps(cfg: RunConfig, num_samples: int) -> int:
    """``--steps``, else the steps of ``--epochs`` over the data set's ``num_samples``
    (:func:`perfsim.job.training_steps`: predict's count), else 20."""
    if cfg.steps is not None:
        return cfg.steps
    if cfg.epochs is not None:
        return training_steps(cfg.epochs, num_samples, cfg.global_batch)
    return 20


class Chunks(torch.nn.ModuleList):
    """The stages one rank holds (several with virtual stages), trained as one module."""


def make_optimizer(cfg: RunConfig, params, dp_group, stage: int, steps: int):
    """The optimizer of a stage's ``params`` (with TP: this rank's local shards): a 1-bit
    optimizer through the public :func:`perfsim.ddp.onebit_optimizer` for ``onebit-*``
    specs, else SGD / AdamW."""
    if cfg.grad_compress.family == "optimizer":  # they exchange compressed momentum
        target = params if isinstance(params, torch.nn.Module) else list(params)
        return pddp.onebit_optimizer(target, cfg.grad_compress, lr=cfg.lr, process_group=dp_group,
                                     seed=cfg.seed * 31 + stage)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=0.9)
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)


def _record_to_dict(rec) -> dict:
    d = dict(rec.__dict__)
    d["micro"] = [m.__dict__ for m in rec.micro]
    return d


def train(cfg: RunConfig, rank: int, world: int) -> None:
    """Body of one rank (process group already initialised)."""
    dp, layout = cfg.dp, cfg.layout
    stage, replica, tp_rank = layout.coords(rank)  # stage: this rank's pipeline device
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) % max(1, torch.cuda.device_count())) \
        if cfg.device == "cuda" else torch.device("cpu")
    tpar = None
    if cfg.tp > 1:
        tpar = TensorParallel(layout, rank, device.type, cfg.sequence_parallel)
        dp_group = tpar.dp_group()
    else:  # every rank creates every data-parallel group, in the same order
        dp_groups = [dist.new_group(ranks) for ranks in layout.dp_group_ranks()]
        dp_group = dp_groups[stage]

    spec = get_model_spec(cfg.model)
    torch.manual_seed(cfg.seed)
    table = cfg.table()
    ranges = cfg.stage_ranges()
    mine = table.stages_of(stage)
    tied_sync = cfg.tied_embedding == "sync"
    stages = {k: Stage(spec, *ranges[k], cfg.seed, tied=tied_sync).to(device) for k in mine}
    tied = None
    if tied_sync:  # every rank creates every replica's group, after the DP groups
        tied = TiedEmbedding(stages, table.num_stages, lambda r: layout.rank(table.stage_device[0], r),
                             lambda r: layout.rank(table.stage_device[-1], r), dp, replica)
    # one stage per rank: the Stage itself (checkpoints as before); several: one module of them
    module = stages[mine[0]] if len(mine) == 1 else Chunks([stages[k] for k in mine])
    # what the optimizer and the gradient sync see: with TP this rank's local shards
    meter = None
    if cfg.zero == 3:  # FSDP2 on every layer (perfsim.runtime.fsdp): it gathers and reduce-scatters itself
        shard_stage(module, list(module.layers), dp_group, device.type)
        meter = CollectiveMeter(dp)
    named = tpar.parallelize(module, [stages[k] for k in mine]) if tpar is not None \
        else list(module.named_parameters())
    dataset = dataset_for(spec, cfg.dataset_limit)
    order = Order(len(dataset), cfg.macro_batch * dp, cfg.seed)
    steps = total_steps(cfg, order.num_samples)
    optimizer = make_optimizer(cfg, [p for _, p in named], dp_group, stage, steps)
    per_stage = {k: make_stage_compressors(cfg, k, table) for k in mine}
    # one flat dict of every compressor (checkpointed); slot names alone with one stage per rank
    comps = {(slot if len(mine) == 1 else f"{k}/{slot}"): c for k in mine for slot, c in per_stage[k].items()}
    # gradients through the public perfsim.ddp state (1-bit optimizers exchange momentum instead)
    grad_state = None if getattr(optimizer, "algorithm", "") or meter is not None else \
        pddp.CompressionState(cfg.grad_compress, dp_group, seed=cfg.seed * 31 + stage)
    runner = StageRunner(stages, table, stage, lambda d: layout.rank(d, replica, tp_rank), per_stage, dataset,
                         cfg.micro_batch, device)

    out = Path(cfg.out)
    ckpt_root = out / "ckpt"
    start, loss_history = 0, {}
    finished = None  # resumed from the final checkpoint to write the results: its session's records
    cfg_dict = json.loads(cfg.to_json())
    if cfg.resume:
        root, meta = checkpoint.find(cfg.resume)
        checkpoint.check_compatible(meta, cfg_dict, RunConfig.RESUME_KEYS,
                                    RunConfig.RESUME_DEFAULTS)
        if int(meta["step"]) >= steps:  # every rank says so, before any file is read
            # killed after its final checkpoint, before its results were written: rank 0's
            # folder decides for all (no shared filesystem needed)
            missing = [int(meta["step"]) == steps and rank == 0 and not results_written(out, steps)]
            dist.broadcast_object_list(missing, src=0)
            if not missing[0]:
                raise ConfigError(f"resume: checkpoint is at step {meta['step']}, nothing left to do for "
                                  f"--steps {steps}")
        state = checkpoint.load_rank(root, meta["step"], rank)
        if int(meta["step"]) >= steps:
            if "session" not in state:
                raise ConfigError(f"resume: checkpoint {checkpoint.step_dir(root, meta['step'])} is at the final "
                                  f"step {steps} but predates the records that write its results: rerun with "
                                  "--overwrite")
            finished = state["session"]
        module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        for slot, st in state["compressors"].items():
            comps[slot].load_state_dict(st)
        if grad_state is not None:
            grad_state.load_state_dict(state["grad_sync"])
        torch.set_rng_state(state["rng"])
        start = int(state["step"])
        loss_history = dict(state["loss_history"])

    def save(step_done: int) -> None:
        error, previous = None, checkpoint.latest(ckpt_root)
        try:
            # AQ-SGD's disk= buffers change at every step: the checkpoint keeps a copy of its own
            with snapshot_into(checkpoint.buffers_dir(ckpt_root, step_done, rank)):
                compressors = {k: c.state_dict() for k, c in comps.items()}
            checkpoint.save_rank(ckpt_root, step_done, rank, {
                "model": module.state_dict(), "optimizer": optimizer.state_dict(),
                "compressors": compressors,
                "grad_sync": grad_state.state_dict() if grad_state is not None else {},
                "rng": torch.get_rng_state(),
                "step": step_done, "loss_history": loss_history,
                # the final checkpoint keeps this session's records: a run killed before writing its
                # results resumes to write them, as they would have been (no step trained again)
                **({"session": {"start_step": start, "records": [_record_to_dict(r) for r in records]}}
                   if step_done == steps else {}),
            })
        except OSError as exc:
            error = f"{type(exc).__name__}: {exc}"
        outcomes = [None] * world  # every rank confirms its save: no rank looks at another's disk
        dist.all_gather_object(outcomes, error)
        failed = [(r, e) for r, e in enumerate(outcomes) if e]
        if failed:
            raise RuntimeError(f"checkpoint step {step_done}: rank {failed[0][0]} could not save "
                               f"({failed[0][1]}); the previous checkpoint stays")
        checkpoint.commit(ckpt_root, step_done, world, cfg_dict, rank, previous)
        dist.barrier()

    # the rank of replica 0's last stage (TP rank 0) reports progress
    reporter = rank == layout.rank(table.stage_device[-1], 0, 0)
    records = []
    last_report = 0.0
    keep_events = 24  # trace only the last steps (the file stays small)
    for step in range(start, steps):
        if cfg.fail_rank == rank and cfg.fail_step == step:  # fault injection (tests)
            os.kill(os.getpid(), getattr(signal, cfg.fail_signal))
        ids = order.replica_batch(step, replica, dp)
        next_ids = order.replica_batch(step + 1, replica, dp) if step + 1 < steps else None
        try:
            if tpar is not None:
                with tpar.meter:
                    rec = runner.run_step(step, order.epoch_of(step), ids, next_ids)
                    tpar.end_backward(module, rec)
            elif meter is not None:
                with meter:
                    rec = runner.run_step(step, order.epoch_of(step), ids, next_ids)
            else:
                rec = runner.run_step(step, order.epoch_of(step), ids, next_ids)
        except ConfigError as exc:  # a compressor refused NaN/Inf/overflowing values: divergence
            if "refusing to compress" not in str(exc):
                raise
            raise TrainingDiverged(step, stage) from None
        if rec.loss is not None and not math.isfinite(rec.loss):
            raise TrainingDiverged(step, stage)
        t0 = time.perf_counter()
        stats = grad_state.sync(named) if dp > 1 and grad_state is not None else {}
        rec.tied_bytes = tied.sync()["bytes"] if tied is not None else 0  # Megatron: after the DP sync
        t1 = time.perf_counter()
        rec.dp_warmup = not getattr(optimizer, "compressing", True)  # 1-bit optimizers' warm-up
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if tpar is not None:
            module.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        rec.dp_sync_s, rec.dp_bytes, rec.optimizer_s, rec.end = t1 - t0, int(stats.get("bytes", 0)), t2 - t1, t2
        if meter is not None:  # FSDP2's collectives ran inside the forwards and backwards
            rec.dp_bytes += int(meter.pop()[0])
        if hasattr(optimizer, "pop_stats"):  # 1-bit optimizers: their exchange is the dp sync
            ostats = optimizer.pop_stats()
            rec.dp_bytes += int(ostats.get("bytes", 0))
            rec.dp_sync_s += ostats.get("time_s", 0.0)
            rec.optimizer_s -= min(rec.optimizer_s, ostats.get("time_s", 0.0))
        rec.events.append(("dp_sync", "dp", t0, t1, {}))
        rec.events.append(("optimizer", "optimizer", t1, t2, {}))
        if len(records) >= keep_events:
            records[-keep_events].events = []
        records.append(rec)
        if rec.loss is not None:
            loss_history[step] = rec.loss
        if reporter and (time.perf_counter() - last_report > 0.3 or step == steps - 1):
            last_report = time.perf_counter()
            atomic_write_text(out / ".ranks" / "progress.json",
                              json.dumps({"step": step + 1, "steps": steps, "loss": rec.loss}))
        done = step + 1
        if meter is None and (done == steps or (cfg.checkpoint_every and done % cfg.checkpoint_every == 0)):
            save(done)

    if finished is not None:
        start, saved = finished["start_step"], finished["records"]
    else:
        saved = [_record_to_dict(r) for r in records]
    payload = {"rank": rank, "stage": stage, "replica": replica, "tp_rank": tp_rank,
               "records": saved, "loss_history": loss_history,
               "peak_inflight": max_in_flight(table[stage]), "steps_per_epoch": order.steps_per_epoch,
               "start_step": start, "steps": steps,
               "params": sum(p.numel() for _, p in named),
               "layers": [stages[mine[0]].start, stages[mine[-1]].end],
               "chunks": [[stages[k].start, stages[k].end] for k in mine]}
    gathered = [None] * world if rank == 0 else None
    dist.gather_object(payload, gathered, dst=0)
    if rank == 0:
        result = build_result(cfg, gathered, dataset_name=dataset.name)
        write_outputs(result, out, gathered)
    dist.barrier()
    for c in comps.values():  # the run completed: no resume needs AQ-SGD's disk= buffers now
        c.release()


def init_and_train(cfg: RunConfig, report: Callable[[BaseException], None] | None = None) -> None:
    """Entry used by a worker process and by ``perfsim run`` under torchrun. ``report``
    is called with a failure before the process group is torn down: a peer learns of this
    rank's end only after its report exists, so the launcher can tell who failed first."""
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    if world != cfg.world_size:
        raise ConfigError(f"WORLD_SIZE={world} but --pp {cfg.pp} x --dp {cfg.dp} x --tp {cfg.tp} = {cfg.world_size}")
    threads = int(os.environ.get("PERFSIM_THREADS", "0")) or max(1, (os.cpu_count() or 1) // world)
    torch.set_num_threads(threads)
    backend = "nccl" if cfg.device == "cuda" else "gloo"
    rank_store.init_group(backend, rank, world, cfg.timeout_s)  # the launcher's store, or env://
    try:
        train(cfg, rank, world)
    except BaseException as exc:
        if report is not None:
            report(exc)
        raise
    finally:
        dist.destroy_process_group()


def die_with_launcher() -> None:
    """SIGKILL this rank when the launcher dies (:func:`perfsim.procs.die_with_parent`)."""
    launcher = os.environ.get("PERFSIM_LAUNCHER_PID")
    if launcher is not None:
        die_with_parent(int(launcher))


def start_heartbeat(rank: int) -> None:
    """Bump this rank's 8-byte slot of the launcher's heartbeat file twice a
    second from a daemon thread: a stopped or frozen rank stops beating."""
    path = os.environ.get("PERFSIM_HEARTBEAT")
    if not path:
        return
    with open(path, "r+b") as f:
        slots = mmap.mmap(f.fileno(), 0)

    def beat():
        n = 0
        while True:
            n += 1
            slots[8 * rank:8 * rank + 8] = n.to_bytes(8, "little")
            time.sleep(HEARTBEAT_PERIOD_S)

    threading.Thread(target=beat, name="perfsim-heartbeat", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    die_with_launcher()
    argv = sys.argv[1:] if argv is None else argv
    cfg = RunConfig.from_dict(json.loads(Path(argv[0]).read_text()))
    rank = int(os.environ.get("RANK", "0"))
    err_path = Path(cfg.out) / ".ranks" / f"rank{rank}.error"
    start_heartbeat(rank)
    reported = []

    def report(exc: BaseException) -> None:
        """One line for the launcher (then the traceback), its mtime the moment of the
        failure to the nanosecond (the launcher names the rank that failed first)."""
        at = time.time_ns()
        line = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        try:
            atomic_write_text(err_path, line + "\n\n" + traceback.format_exc())
            os.utime(err_path, ns=(at, at))
        except OSError:
            pass
        reported.append(exc)

    try:
        init_and_train(cfg, report)
    except BaseException as exc:  # report one line for the launcher, then fail
        if exc not in reported:
            report(exc)
        traceback.print_exc()
        return 2 if isinstance(exc, ConfigError) else 1
    return 0


if __name__ == "__main__":
    from perfsim.procs import exit_rank

    exit_rank(main())
