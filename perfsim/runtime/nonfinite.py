"""Naming the culprit of a refused data-parallel exchange, identically on every rank.

A NaN/Inf gradient (or momentum) on one rank must stop every rank at the same point
with the same one-line error naming the step, the parameter group or bucket, the
parameter and the rank -- not one rank with a message and its peers hung in a
collective or failing with gloo's "Connection closed by peer".

Two steps, the first free in the normal case:

1. **The signal rides in a value every rank already receives**, so a step that trains
   sends no extra byte and ``perfsim predict`` keeps pricing exactly the bytes sent:
   a +Inf shared norm in the max-allreduce of the max-norm quantizers
   (:class:`perfsim.compression.maxnorm.MaxNormQuantizer`, random-k through it), an Inf
   norm among the all-gathered ones (``qsgd``, ``ecq``), a NaN scale of the 1-bit
   exchange (:class:`perfsim.compression.onebit.OneBit`), a non-finite sum of an fp32
   allreduce (the 1-bit optimizers' warm-up, PowerSGD's allreduces). Every rank then
   raises :class:`perfsim.errors.NonFiniteError` at the same collective, with the
   compressor's state (error feedback, random counters) unchanged.
2. **Error path only**: having all learned that the exchange failed, the ranks call
   :func:`culprits` together -- one all-gather of one int64 per rank (this rank's
   first non-finite tensor, or :data:`TOO_LARGE`, or :data:`OK`) -- so each can name
   the same rank and parameter. This collective never runs in a step that trains.
"""

from __future__ import annotations

from typing import Callable, Sequence

from perfsim._lazy import torch

#: :func:`local_code` of a rank whose tensors are all finite and which refused nothing
OK = -1
#: :func:`local_code` of a rank whose finite values were too large to encode (a norm beyond float32)
TOO_LARGE = -2


def _world(group) -> int:
    import torch.distributed as dist  # lazy: torch is heavy, needed only here

    if not dist.is_available() or not dist.is_initialized():
        return 1
    return dist.get_world_size(group)


def local_code(parts: Sequence[torch.Tensor], refused_here: bool = False) -> int:
    """Index of the first tensor of ``parts`` holding NaN/Inf; else :data:`TOO_LARGE`
    when this rank's (finite) input was refused, else :data:`OK`."""
    for i, t in enumerate(parts):
        if t.numel() and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            return i
    return TOO_LARGE if refused_here else OK


def culprits(code: int, group=None, device=None) -> list[int]:
    """Every rank's :func:`local_code`, in rank order: one all-gather of one int64 per
    rank. Call it on every rank of ``group`` at the same point (after an exchange
    told all of them that it failed), never in a training step."""
    world = _world(group)
    if world == 1:
        return [int(code)]
    import torch.distributed as dist  # lazy: torch is heavy, needed only here

    mine = torch.tensor([int(code)], dtype=torch.int64, device=device)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine, group=group)
    return [int(t) for t in every]


def describe(codes: Sequence[int], name_of: Callable[[int], str]) -> str:
    """``NaN/Inf in <name_of(code)> on rank R`` for the first rank whose code is not
    :data:`OK` (others listed), the same text on every rank."""
    bad = [(r, c) for r, c in enumerate(codes) if c != OK]
    if not bad:  # every rank's own values are finite: their sum overflowed
        return "values whose sum over the ranks overflows (each rank's own are finite)"
    rank, code = bad[0]
    what = f"NaN/Inf in {name_of(code)}" if code >= 0 else "values too large to encode (a norm beyond float32)"
    also = f" (and rank{'s' if len(bad) > 2 else ''} {', '.join(str(r) for r, _ in bad[1:])})" \
        if len(bad) > 1 else ""
    return f"{what} on rank {rank}{also}"
