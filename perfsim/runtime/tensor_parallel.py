"""Real tensor parallelism in execute mode (``perfsim run --tp T``).

Megatron-LM's layout (Shoeybi et al., "Megatron-LM", arXiv:1909.08053, Sec. 3)
built from torch's ``torch.distributed.tensor.parallel``: in every transformer
block the attention ``qkv`` and the MLP ``fc`` are column-parallel
(``ColwiseParallel``), the attention ``proj`` and the MLP ``fc_proj``
row-parallel (``RowwiseParallel``), so a block costs two allreduces of the
``b x s x h`` activation forward (after ``proj`` and ``fc_proj``) and two
backward (the input gradients of ``qkv`` and ``fc``). Each TP rank holds
``n_head / T`` heads: the ``qkv`` rows are reordered so that the contiguous
row shard of rank ``i`` is ``[q_i; k_i; v_i]`` of its heads (Megatron's
per-partition layout).

With ``sequence_parallel`` (Korthikanti et al., "Reducing Activation
Recomputation in Large Transformer Models", arXiv:2205.05198, Sec. 4.2.2) the
LayerNorms run on a ``1/T`` slice of the sequence (``SequenceParallel``), each
allreduce becomes an all-gather before the column-parallel layer and a
reduce-scatter after the row-parallel one (the same in backward, reversed); the
embedding's output is scattered along the sequence and gathered again before
the LM head, and pipeline stages exchange the ``1/T`` sequence slice.

Embedding and LM head stay replicated on every TP rank (they are small for the
byte-level presets; Megatron shards the vocabulary). Without sequence
parallelism every TP rank of a stage sends the full activation to the same TP
rank of the next stage (no scatter/gather optimisation).

Rank order: the job's ``placement`` (:attr:`perfsim.job.Job.placement`, the simulator's
too), innermost first -- by default TP, then PP, then DP (``rank = t + T * (s + P * d)`` for
TP rank ``t``, stage ``s``, replica ``d``); Megatron's TP, DP, PP with ``--placement tp,dp,pp``.

What TP really sends is counted by :class:`CollectiveMeter`, which wraps the
functional collectives (``torch.ops._c10d_functional``) every DTensor
redistribution goes through and waits for each, so its bytes and wall time are
known. Bytes are the buffer each rank hands to the collective (torch.distributed's
convention, and the simulator's ``perfsim.models.tensor_parallel``): the full
tensor of an allreduce or a reduce-scatter, the rank's own shard of an all-gather.
"""

from __future__ import annotations

import re
import time

import torch

from perfsim.collectives import TENSOR_CALLS
from perfsim.runtime.layout import RankLayout  # noqa: F401 (its home before; the TP group builder's)
from perfsim.runtime.models import Block, Embed, Head

#: a compute trace event of the runtime: ``<stage><F|B|I|W><micro-batch>``
COMPUTE_EVENT = re.compile(r"^\d+([FBIW])(\d+)$")
#: functional collective op -> collective kind (the simulator's names, one table)
KINDS = TENSOR_CALLS


# ----------------------------------------------------------------------------- the model
def megatron_qkv_order(d_model: int, tp: int) -> torch.Tensor:
    """Row permutation of a fused ``[q; k; v]`` weight (``3d x d``) after which the
    ``i``-th contiguous ``3d/tp`` row block is ``[q_i; k_i; v_i]`` of rank ``i``'s heads."""
    part = d_model // tp
    rows = [torch.arange(j * d_model + i * part, j * d_model + (i + 1) * part)
            for i in range(tp) for j in range(3)]
    return torch.cat(rows)


def block_plan(sequence_parallel: bool) -> dict:
    """``parallelize_module`` plan of one :class:`perfsim.runtime.models.Block`."""
    from torch.distributed.tensor import Shard  # lazy: torch is heavy, needed only here
    # lazy: torch is heavy, needed only here
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    if not sequence_parallel:
        return {"qkv": ColwiseParallel(), "proj": RowwiseParallel(),
                "fc": ColwiseParallel(), "fc_proj": RowwiseParallel()}
    return {"ln1": SequenceParallel(), "qkv": ColwiseParallel(input_layouts=Shard(1)),
            "proj": RowwiseParallel(output_layouts=Shard(1)),
            "ln2": SequenceParallel(), "fc": ColwiseParallel(input_layouts=Shard(1)),
            "fc_proj": RowwiseParallel(output_layouts=Shard(1))}


def parallelize_stage(stage, mesh, sequence_parallel: bool = False):
    """Shard the blocks of a :class:`perfsim.runtime.models.Stage` over the 1-D TP
    ``mesh`` in place (module docstring); returns the stage."""
    from torch.distributed.tensor import Replicate, Shard  # lazy: torch is heavy, needed only here
    # lazy: torch is heavy, needed only here
    from torch.distributed.tensor.parallel import (PrepareModuleInput, PrepareModuleOutput,
                                                   parallelize_module)

    tp = mesh.size()
    for layer in stage.layers:
        if isinstance(layer, Block):
            order = megatron_qkv_order(layer.qkv.in_features, tp)
            with torch.no_grad():
                layer.qkv.weight.copy_(layer.qkv.weight[order])
                layer.qkv.bias.copy_(layer.qkv.bias[order])
            parallelize_module(layer, mesh, block_plan(sequence_parallel))
        elif sequence_parallel and isinstance(layer, Embed):  # scatter the sequence (backward: gather)
            parallelize_module(layer, mesh, PrepareModuleOutput(
                output_layouts=Replicate(), desired_output_layouts=Shard(1), use_local_output=True))
        elif sequence_parallel and isinstance(layer, Head):  # gather the sequence for the LM head
            parallelize_module(layer, mesh, PrepareModuleInput(
                input_layouts=Shard(1), desired_input_layouts=Replicate(), use_local_output=True))
    return stage


def finish_gradients(module) -> None:
    """Reduce the gradients DTensor left partial (sequence-parallel LayerNorms, the
    row-parallel biases): each TP rank saw only its slice of the sequence. Megatron
    allreduces these after the backward pass too."""
    from torch.distributed.tensor import DTensor  # lazy: torch is heavy, needed only here

    for p in module.parameters():
        g = p.grad
        if isinstance(g, DTensor) and any(pl.is_partial() for pl in g.placements):
            p.grad = g.redistribute(g.device_mesh, p.placements)


def local_leaves(module) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` per parameter: a DTensor's local shard as a plain leaf
    tensor sharing its storage (other parameters as they are). The optimizer and the
    data-parallel gradient sync work on these (plain tensors, this rank's shard);
    :func:`bind_gradients` points their ``.grad`` at the DTensor gradients' shards."""
    from torch.distributed.tensor import DTensor  # lazy: torch is heavy, needed only here

    return [(name, p.to_local().detach().requires_grad_(p.requires_grad) if isinstance(p, DTensor) else p)
            for name, p in module.named_parameters()]


def bind_gradients(module, leaves) -> None:
    """Each leaf of :func:`local_leaves` gets its parameter's local gradient
    (sharing storage: an in-place average writes the DTensor's gradient)."""
    from torch.distributed.tensor import DTensor  # lazy: torch is heavy, needed only here

    for (_, leaf), p in zip(leaves, module.parameters()):
        if leaf is not p:
            leaf.grad = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad


# ----------------------------------------------------------------------------- counting
class _Metered:
    """A functional collective op that records kind, buffer bytes and wall time."""

    def __init__(self, real, meter: "CollectiveMeter", name: str):
        self.real, self.meter, self.name = real, meter, name

    def __getattr__(self, attr):  # .default, .overloads() ... of the real packet
        return getattr(self.real, attr)

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = self.real(*args, **kwargs)
        out = torch.ops._c10d_functional.wait_tensor(out)
        if out.is_cuda:  # NCCL: wait_tensor only orders the stream; time the transfer itself
            torch.cuda.synchronize(out.device)
        t1 = time.perf_counter()
        self.meter.record(self.name, args, t0, t1)
        return out


class CollectiveMeter:
    """Counts the collectives DTensor issues on one process group while active.

    ``events``: ``(kind, bytes, t0, t1)`` per collective (kinds of :data:`KINDS`;
    bytes as in the module docstring), in issue order; :meth:`pop` returns and
    clears them. Each collective is waited for when issued (on gloo the next
    operation would wait for it anyway), so ``t1 - t0`` is its time.
    """

    def __init__(self, group_name: str | None = None):
        self.group_name = group_name
        self.events: list[tuple[str, int, float, float]] = []
        self._saved: dict[str, object] = {}

    def record(self, name: str, args, t0: float, t1: float) -> None:
        inp = args[0]
        group = args[-1]
        if self.group_name is not None and group != self.group_name:
            return
        self.events.append((KINDS[name], int(inp.numel() * inp.element_size()), t0, t1))

    def pop(self) -> list[tuple[str, int, float, float]]:
        out, self.events = self.events, []
        return out

    def __enter__(self) -> "CollectiveMeter":
        ns = torch.ops._c10d_functional
        for name in KINDS:
            self._saved[name] = getattr(ns, name)
            setattr(ns, name, _Metered(self._saved[name], self, name))
        return self

    def __exit__(self, *exc) -> None:
        ns = torch.ops._c10d_functional
        for name, real in self._saved.items():
            setattr(ns, name, real)
        self._saved.clear()


def charge_step(rec, events, after: tuple[float, float] | None = None) -> None:
    """Book one step's TP collectives on its :class:`~perfsim.runtime.pipeline.StepRecord`.

    A collective inside a forward / backward compute interval (``<stage>F<mb>``,
    ``<stage>B<mb>`` or a split backward's ``I``/``W``: the runtime's trace events) is taken out of that micro-batch's compute time;
    every collective adds to ``rec.tp_comm_s``, ``rec.tp_bytes`` and
    ``rec.tp_ops`` (count per kind) and becomes a trace event (category ``tp``).
    """
    spans = []
    for name, cat, t0, t1, _ in rec.events:
        m = COMPUTE_EVENT.match(name) if cat == "compute" else None
        if m:
            spans.append((t0, t1, m.group(1) == "F", int(m.group(2))))
    for kind, nbytes, t0, t1 in events:
        dur = t1 - t0
        rec.tp_comm_s += dur
        rec.tp_bytes += nbytes
        rec.tp_ops[kind] = rec.tp_ops.get(kind, 0) + 1
        for s0, s1, forward, mb in spans:
            if s0 <= t0 and t1 <= s1:
                r = rec.micro[mb]
                if forward:
                    r.fwd_compute_s -= dur
                else:
                    r.bwd_compute_s -= dur
                break
        rec.events.append((f"tp {kind}", "tp", t0, t1, {"bytes": nbytes}))


# ----------------------------------------------------------------------------- one rank
class TensorParallel:
    """The TP side of one rank: its mesh, its sharded stage and its meter.

    ``layout``/``rank``: where this rank sits; every rank must construct the TP
    groups in the same order, so all ranks build the mesh (``device_type``
    ``cpu`` for gloo, ``cuda`` for NCCL).
    """

    def __init__(self, layout: RankLayout, rank: int, device_type: str, sequence_parallel: bool = False):
        from torch.distributed.device_mesh import init_device_mesh  # lazy: torch is heavy, needed only here

        self.layout, self.rank = layout, rank
        self.sequence_parallel = sequence_parallel
        shape, names = layout.mesh_dims()  # the ranks numbered as the layout numbers them
        self.mesh = init_device_mesh(device_type, shape, mesh_dim_names=names)
        self.tp_mesh = self.mesh["tp"]
        self.meter = CollectiveMeter(self.tp_mesh.get_group().group_name)

    def dp_group(self):
        return self.mesh["dp"].get_group()

    def parallelize(self, module, stages=None) -> list[tuple[str, torch.Tensor]]:
        """Shard ``stages`` (the model chunks ``module`` holds; default: ``module``
        is one Stage) in place; returns ``module``'s :func:`local_leaves` (what the
        optimizer and the data-parallel sync get)."""
        for stage in stages if stages is not None else [module]:
            parallelize_stage(stage, self.tp_mesh, self.sequence_parallel)
        self.leaves = local_leaves(module)
        return self.leaves

    def end_backward(self, module, rec) -> None:
        """After a step's forward/backward: reduce partial gradients, hand the local
        gradients to the leaves, and book the step's collectives on ``rec``."""
        t0 = time.perf_counter()
        finish_gradients(module)
        bind_gradients(module, self.leaves)
        charge_step(rec, self.meter.pop())
        rec.events.append(("tp finish grads", "tp", t0, time.perf_counter(), {}))
