"""Turn a simulated iteration into a :class:`perfsim.result.Result`.

Definitions (per iteration of one macro-batch per replica):

* ``iteration_s``: from the first forward to the last optimizer step ends, plus
  ``sync_wait_s``, the expected wait for the slowest GPU (:mod:`perfsim.engine.sync_wait`;
  0 unless ``straggler_cv`` / ``jitter_cv`` are given);
* throughput: ``macro_batch * dp / iteration_s`` samples/s (x tokens/sample);
* ``bubble_fraction``: ``1 - sum_s busy_s / (p * T_pipe)`` with ``busy`` the
  compute + encode/decode (+ tensor-parallel collective) time of stage ``s`` and ``T_pipe`` the time until the
  last backward ends (Huang et al., "GPipe", arXiv:1811.06965, Sec. 2.3: with free
  communication this is ``(p-1)/(m+p-1)``);
* per-stage ``idle_s``: ``iteration_s`` minus compute, encode/decode, TP
  collectives and the optimizer step (waiting for data, for the gradient sync, or the bubble);
* per-stage ``comm_s``: summed time from the start of each message the stage
  sent (after the earlier ones on its connection) to its delivery (it overlaps
  compute);
* summary ``compute_s``/``comm_s``/``encode_s``/``idle_s``/``dp_sync_s``/
  ``optimizer_s``: means over the stages;
* ``epoch_s``: steady-state epoch (``ceil(dataset / (macro_batch * dp))``
  iterations, :func:`perfsim.job.steps_per_epoch`; ``dataset_samples``: the model's own
  data set where perfsim knows it, :mod:`perfsim.models.datasets`); ``optimizer_steps``:
  the steps of ``epochs`` epochs, what ``perfsim run --epochs`` trains; ``warmup_s``: the warm-up iterations -- AQ-SGD's first epoch (full
  activations on a sample's first visit; Wang et al., "Fine-tuning Language Models
  over Slow Networks using Activation Compression with Guarantees",
  arXiv:2206.01299, Sec. 3 / Alg. 1), a 1-bit optimizer's uncompressed steps (Li et
  al., "1-bit LAMB", arXiv:2104.06069, Sec. 3-4); ``total_s``:
  ``epochs`` epochs end to end, warm-up included;
* ``events``: the SimPy events the event loop processed, or the steps the
  closed-form replay evaluated (``engine``: ``event loop`` or ``replay``,
  :mod:`perfsim.engine.replay`; both give the same iteration);
* per-stage ``tp_comm_s``: the stage's tensor-parallel collectives (serial with
  compute, not in ``compute_s``); ``memory_gib`` and its parts per GPU
  (:mod:`perfsim.memory`); summary ``peak_memory_gib`` (largest stage), ``fits``
  (None without a GPU preset), ``params`` (whole model), ``compute_model``, ``codec_model``
  (:func:`perfsim.engine.codec_cost.codec_costs`); summary
  ``tp_bytes``: bytes the TP collectives send per iteration, summed over all ranks
  (``perfsim run --tp`` meters the buffers handed to them instead: the same for an
  all-reduce at tp = 2, not for all-gather / reduce-scatter); ``tied_bytes``: bytes
  the tied-embedding all-reduces between the first and the last stage send per
  iteration, all ranks (``tied_embedding`` ``sync``; their time is in ``dp_sync_s``).
"""

from __future__ import annotations


from perfsim.compression.refresh import uncompressed_steps
from perfsim.network import collective_cost
from perfsim.engine.sync_wait import sync_wait_s
from perfsim.engine.uncertainty import interval
from perfsim.job import steps_per_epoch, training_steps
from perfsim.memory import GIB, device_memory
from perfsim.result import Result
from perfsim.schedules import max_in_flight


def _topology_links(topo) -> tuple[float, float]:
    """A topology row's own link figures: its slowest inter-node rate and its
    largest latency (``--bandwidth``/``--latency`` do not apply to it)."""
    rates = [b for row in topo.bandwidth for b in row if b > 0]
    rates += [b for _, (b, _) in topo.overrides if b is not None]
    lats = [x for row in topo.latency for x in row] + [x for _, (_, x) in topo.overrides if x is not None]
    return (min(rates) if rates else float("nan")), (max(lats) if lats else 0.0)


def build_result(out, warm, plan, workload, strategy, system, extra: dict | None = None,
                 weights: dict[int, int] | None = None, memory=None, network=None) -> Result:
    """``out``: steady-state SimOutput; ``warm``: the warm-up iteration's, or None."""
    p, dp = plan.pp, plan.dp
    table = plan.table
    inflight = [max_in_flight(row) for row in table]
    # each simulated replica stands for a class of identical ones
    weights = weights or {r: 1 for r in out.replicas}
    # the slowest of the job's GPUs (perfsim.engine.sync_wait; 0 unless a spread is given)
    wait = sync_wait_s(max((d.compute_s + d.tp_comm_s for d in out.devices.values()), default=0.0),
                       plan.tp * p * dp, plan.num_microbatches, system.straggler_cv, system.jitter_cv)
    T = out.iteration_s + wait

    mem, cap = memory if memory is not None else (None, None)
    dev_mem = device_memory(mem, table) if mem else []
    static = []  # per pipeline device: what its stages (chunks) are, the same in every replica
    for s in range(p):
        chunks = [plan.stages[k] for k in table.stages_of(s)]
        ms = [mem[k] for k in table.stages_of(s)] if mem else []
        gib = (lambda f: sum(getattr(x, f) for x in ms) / GIB if ms else None)  # noqa: E731
        static.append({
            "layers": ",".join(f"{sp.first_layer}-{sp.last_layer - 1}" for sp in chunks),
            "params": sum(sp.params for sp in chunks),
            "fwd_s_per_mb": sum(sp.fwd_s for sp in chunks), "bwd_s_per_mb": sum(sp.bwd_s for sp in chunks),
            "fw_bytes_per_mb": sum(sp.fw_bytes for sp in chunks),
            "bw_bytes_per_mb": sum(sp.bw_bytes for sp in chunks),
            "tp_comm_s": None,  # per replica (set below); listed here for the column order
            "tp_bytes_per_mb": sum(sp.tp_bytes for sp in chunks),
            "memory_gib": gib("total"), "weights_gib": gib("weights"),
            "grads_gib": gib("grads"), "optimizer_state_gib": gib("optimizer"),
            "activations_gib": gib("activations"),
            "buffers_gib": gib("buffers"),
            "sharding_buffers_gib": gib("sharding"),
        })
    stages = []
    for (r, s), d in sorted(out.devices.items()):  # s: the pipeline device
        stages.append({
            "replica": r, "stage": s, "compute_s": d.compute_s, "comm_s": d.comm_s,
            "encode_s": d.codec_s,
            "idle_s": max(0.0, T - d.compute_s - d.codec_s - d.optimizer_s - d.tp_comm_s),
            "dp_sync_s": d.dp_sync_s, "interference_s": d.interference_s,
            "bytes_sent": d.bytes_sent + out.dp_bytes_per_rank.get(s, 0.0),
            "peak_inflight": inflight[s], "optimizer_s": d.optimizer_s, "represents": weights[r],
        })
        stages[-1].update(static[s], tp_comm_s=d.tp_comm_s)
    n = sum(st["represents"] for st in stages)
    busy = sum((d.compute_s + d.codec_s + d.tp_comm_s) * weights[r] for (r, _), d in out.devices.items())
    bubble = 1.0 - busy / (n * out.pipeline_s) if out.pipeline_s > 0 else 0.0
    bubble = 0.0 if -1e-9 < bubble < 0.0 else bubble  # a sum's rounding, not idle time ("-0.0 %")
    micro = [dict(stage=s, microbatch=mb, fwd_compute_s=c.get("fwd_compute_s", 0.0),
                  fwd_comm_s=c.get("fwd_comm_s", 0.0), bwd_compute_s=c.get("bwd_compute_s", 0.0),
                  bwd_comm_s=c.get("bwd_comm_s", 0.0), encode_s=c.get("encode_s", 0.0))
             for (r, s, mb), c in sorted(out.micro.items()) if r == out.replicas[0]]
    links = [dict(src=src, dst=dst, bytes=b, busy_s=busy_s, kind=kind)
             for (src, dst, kind), (b, busy_s) in sorted(out.links.items())]
    samples = strategy.global_batch  # macro_batch x dp: a context-parallel group's ranks share their samples
    iters = steps_per_epoch(strategy.dataset_samples, samples)  # perfsim run's count (perfsim.job)
    warm_T = warm.iteration_s + wait if warm is not None else T
    epoch_s = iters * T
    # warm-up iterations: AQ-SGD's first epoch, a 1-bit optimizer's uncompressed steps
    # (its warm-up and its variance refreshes; both at once: the longer of the two,
    # simulated with both effects)
    total_iters = training_steps(strategy.epochs, strategy.dataset_samples, samples)
    onebit_iters = uncompressed_steps(total_iters, plan.onebit_warmup_steps, plan.onebit_refresh)
    warm_iters = min(total_iters, max(iters if plan.has_warmup else 0, onebit_iters))
    warmup_s = warm_iters * warm_T
    total_s = warmup_s + (total_iters - warm_iters) * T
    mean = lambda key: sum(st[key] * st["represents"] for st in stages) / n  # noqa: E731
    topo = system.topology
    bw_bps, lat_s = (system.bandwidth_bps, system.latency_s) if topo is None else _topology_links(topo)
    summary = {
        "model": workload.model, "bandwidth_bps": bw_bps, "latency_s": lat_s,
        "compress": strategy.compress.text, "grad_compress": strategy.grad_compress.text,
        "boundary_compress": strategy.boundary_compress.text,
        "device_order": ",".join(map(str, strategy.device_order)) if strategy.device_order else "",
        "schedule": strategy.schedule, "pp": p, "dp": strategy.dp, "micro_batch": strategy.micro_batch,
        "macro_batch": strategy.macro_batch,
        "throughput_samples_per_s": samples / T, "throughput_tokens_per_s": samples * workload.tokens_per_sample / T,
        "iteration_s": T, "sync_wait_s": wait, "bubble_fraction": bubble,
        "compute_s": mean("compute_s"), "comm_s": mean("comm_s"), "encode_s": mean("encode_s"),
        "idle_s": mean("idle_s"), "dp_sync_s": mean("dp_sync_s"), "optimizer_s": mean("optimizer_s"),
        "pipeline_bytes": sum(sp.fw_bytes + sp.bw_bytes for sp in plan.stages) * plan.num_microbatches * dp,
        "dp_bytes": sum(out.dp_bytes_per_rank.values()) * dp,
        "peak_inflight": max(inflight), "epoch_s": epoch_s, "source": "predicted",
        "total_s": total_s, "epochs": strategy.epochs, "iterations_per_epoch": iters,
        "dataset_samples": strategy.dataset_samples, "optimizer_steps": total_iters,
        "warmup_iteration_s": warm_T, "warmup_iterations": warm_iters, "warmup_s": warmup_s,
        "interference_s": mean("interference_s"), "pipeline_s": out.pipeline_s,
        "virtual_stages": table.virtual_stages,
        "topology": (topo.source if topo is not None else ""), "replicas_simulated": len(out.replicas),
        "events": out.events + (warm.events if warm is not None else 0), "engine": out.engine,
        "params": sum(layer.params for layer in workload.layers), "tp": strategy.tp,
        "sequence_parallel": strategy.sequence_parallel, "tp_send": strategy.tp_send, "precision": strategy.precision,
        "recompute": strategy.recompute, "attention": strategy.attention, "kernels": strategy.kernels,
        "grad_accumulation": strategy.grad_accumulation,
        "zero": strategy.zero, "optimizer": strategy.optimizer,
        "reshard_after_forward": strategy.reshard_after_forward, "cross_entropy": strategy.cross_entropy,
        "global_batch": strategy.global_batch,
        "gpus": strategy.devices, "gpu": system.gpu or "", "tp_comm_s": mean("tp_comm_s"),
        # bytes sent by every rank's TP collectives per iteration (ring volume; every model chunk)
        "tp_bytes": sum(sp.tp_bytes for sp in plan.stages) * plan.num_microbatches * dp * strategy.tp,
        # expert parallelism: its all-to-alls per stage and micro-batch (in tp_comm_s), bytes per iteration
        "cp": getattr(strategy, "cp", 1), "ep": strategy.ep, "ep_comm_s": max((sp.ep_s for sp in plan.stages), default=0.0) * plan.num_microbatches,
        "ep_bytes": sum(sp.ep_bytes for sp in plan.stages) * plan.num_microbatches * dp * strategy.tp,
        # --ep-overlap: of ep_comm_s, the seconds hidden beside another micro-batch's compute (per stage)
        "ep_overlap": strategy.ep_overlap, "ep_hidden_s": _hidden_per_stage(plan),
        # bytes sent by every rank of the tied-embedding all-reduces (first and last stage) per iteration
        "tied_embedding": strategy.tied_embedding,
        "tied_bytes": 2 * collective_cost("allreduce", plan.tied_sync_bytes, 2)[0] * dp * strategy.tp,
        "peak_memory_gib": max(dev_mem) / GIB if mem else None,
        "memory_capacity_gib": cap / GIB if cap else None,
        "fits": (max(dev_mem) <= cap) if mem and cap else None,
        # CPU offload (perfsim.engine.offload): the optimizer state each GPU keeps in host memory
        "offload": strategy.offload,
        "host_memory_gib": max(sum(mem[k].host for k in table.stages_of(d)) for d in range(p)) / GIB if mem else None,
        "compute_model": ("profile: each tensor-parallel rank's compute as perfsim calibrate --tp measured it "
                          "(execute mode, collectives taken out); collectives modelled"
                          if strategy.tp > 1 and any(sp.whole_stage_measured for sp in plan.stages)
                          else workload.compute_source),
        "codec_model": plan.codec_model,  # encodes / decodes: the profile's records, or the GPU's model
    }
    if plan.shard_host_note:  # a CPU profile's ZeRO-3: what FSDP2's host time was priced from
        summary["shard_host_note"] = plan.shard_host_note
    summary.update(interval(summary))
    if network is not None:
        link, coll = network.link, network.collective_link
        algos = out.collective_algos
        summary.update({"gpus_per_node": system.gpus_per_node, "nic_kind": system.nic_kind,
                        "nics_per_node": system.nics_per_node,
                        "intra_node_bandwidth_bps": system.intra_node_bandwidth_bps,
                        "link_rate_bps": link.rate_bps, "link_one_way_s": link.one_way_s,
                        "link_burst_bytes": link.burst_bytes, "link_source": link.source,
                        "collective_link_rate_bps": coll.rate_bps, "collective_link_one_way_s": coll.one_way_s,
                        "collective_link_burst_bytes": coll.burst_bytes, "collective_link_source": coll.source,
                        "collective_algo": system.collective_algo if not algos else ",".join(algos)})
        # the TCP window ceiling (perfsim.tcp): at the link's round trip, per pair on a topology
        summary.update(network.tcp.facts(None if topo is not None else 2.0 * link.latency_s))
        summary.update(network.slow_start.facts())  # slow start after idle (perfsim.tcp)
    if extra:
        summary.update(extra)
    trace = []
    if out.trace:
        for r in out.replicas:
            trace.append({"name": "process_name", "ph": "M", "pid": r, "args": {"name": f"replica {r}"}})
            for s in range(p):
                trace.append({"name": "thread_name", "ph": "M", "pid": r, "tid": s,
                              "args": {"name": f"stage {s} compute"}})
                trace.append({"name": "thread_name", "ph": "M", "pid": r, "tid": 1000 + s,
                              "args": {"name": f"stage {s} send"}})
                trace.append({"name": "thread_name", "ph": "M", "pid": r, "tid": 2000 + s,
                              "args": {"name": f"stage {s} grad sync"}})
        trace.extend(out.trace)
    return Result(summary, stages, micro, links, trace)


def _hidden_per_stage(plan) -> float:
    """The most all-to-all seconds one stage hides per iteration under ``--ep-overlap``
    (:attr:`perfsim.engine.plan.Plan.ep_savings`; 0 without it)."""
    per: dict[int, float] = {}
    for (stage, _, _), seconds in plan.ep_savings.items():
        per[stage] = per.get(stage, 0.0) + seconds
    return max(per.values(), default=0.0)
