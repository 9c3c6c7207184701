"""A mixture of experts' token all-to-alls hidden under another micro-batch's compute (``--ep-overlap``).

Megatron-Core's ``--overlap-moe-expert-parallel-comm`` runs the "combined 1F1B" schedule: in the
steady state the forward of one micro-batch and the backward of another (consecutive F and B on a
device, of different micro-batches) go through their layers together, each one's expert-parallel
all-to-alls on a communication stream beside the other's compute. Per MoE layer pair, as its design
notes lay the streams out (NVIDIA Megatron-LM, ``combined_1f1b``; the same pairing as DeepSeek-V3's
DualPipe, DeepSeek-AI 2024, arXiv:2412.19437, Sec. 3.2.1 and Fig. 4):

* the forward's attention beside the backward's combine gradient;
* the backward's and the forward's MLPs beside the forward's dispatch and the backward's dispatch gradient;
* the backward's attention beside the forward's combine.

A phase of compute ``c`` beside communication ``x`` lasts :func:`beside`: the all-to-all kernels
take :data:`COMM_SM_SHARE` of the GPU's SMs from the compute while they run. Warm-up forwards,
cool-down backwards and a micro-batch's own F then B are not paired and keep their all-to-alls
serial. The tensor-parallel collectives stay serial (the design pairs only the expert-parallel ones).
"""

from __future__ import annotations

from dataclasses import dataclass

from perfsim.schedules import BACKWARD, FORWARD

#: the share of the SMs the all-to-all kernels hold while they run beside compute: DeepSeek-V3 gives
#: its dispatch and combine kernels 20 of an H800's 132 SMs, "sufficient to fully utilize the
#: bandwidths of IB and NVLink" (arXiv:2412.19437, Sec. 3.2.2); Megatron-Core's overlap recipes
#: reserve the same 20 SMs from Transformer Engine's norms (``NVTE_*_LAYERNORM_SM_MARGIN=20``)
COMM_SM_SHARE = 20 / 132


@dataclass(frozen=True)
class MoELayerTimes:
    """One MoE block of a stage, one micro-batch, seconds on one GPU."""

    attn_fwd: float
    attn_bwd: float
    mlp_fwd: float
    mlp_bwd: float
    #: one forward all-to-all at the training precision: the combine (and the dispatch, uncompressed)
    a2a_fwd: float
    #: one backward all-to-all at the training precision: the dispatch's gradient (and the combine's,
    #: uncompressed)
    a2a_bwd: float
    #: the stage's MoE blocks
    blocks: int
    #: ``--a2a-compress``: the compressed forward dispatch's all-to-all, its codec not included (the
    #: codec's kernels run on the compute stream, serial either way); None: as ``a2a_fwd``
    wire_fwd: float | None = None
    #: ``--a2a-compress``: the compressed backward all-to-all, the gradient into the expert outputs
    #: (the combine's gradient); None: as ``a2a_bwd``
    wire_bwd: float | None = None

    @property
    def dispatch_fwd(self) -> float:
        return self.a2a_fwd if self.wire_fwd is None else self.wire_fwd

    @property
    def combine_bwd(self) -> float:
        return self.a2a_bwd if self.wire_bwd is None else self.wire_bwd

    @property
    def comm_fwd(self) -> float:
        """A block's two forward all-to-alls: the dispatch and the combine."""
        return self.dispatch_fwd + self.a2a_fwd

    @property
    def comm_bwd(self) -> float:
        """A block's two backward all-to-alls: the combine's gradient and the dispatch's."""
        return self.combine_bwd + self.a2a_bwd


def beside(compute: float, comm: float, share: float = COMM_SM_SHARE) -> float:
    """Seconds of ``compute`` (alone) run while ``comm`` seconds of communication hold ``share`` of
    the SMs: the compute runs at ``1 - share`` of its speed while they overlap,
    ``max(comm, compute + share x comm)``."""
    return max(comm, compute + share * comm)


def pair_saving(f: MoELayerTimes, b: MoELayerTimes) -> float:
    """Seconds a forward of stage ``f`` and a backward of stage ``b`` save run as one combined unit
    (module docstring) over running one after the other: per MoE layer pair, the serial sum less the
    three phases; ``min`` of the two stages' MoE blocks pair up. Under ``--a2a-compress`` the
    compressed all-to-alls (the forward dispatch, the backward's gradient into the expert outputs)
    are shorter; their codec kernels run on the compute stream, serial in both orders, so they save
    nothing and are not counted here."""
    serial = (f.attn_fwd + f.mlp_fwd + f.comm_fwd) + (b.attn_bwd + b.mlp_bwd + b.comm_bwd)
    combined = (beside(f.attn_fwd, b.combine_bwd) + beside(b.mlp_bwd + f.mlp_fwd, f.dispatch_fwd + b.a2a_bwd)
                + beside(b.attn_bwd, f.a2a_fwd))
    return min(f.blocks, b.blocks) * max(0.0, serial - combined)


def savings(table, layers: list[MoELayerTimes | None]) -> dict[tuple[int, int, str], float]:
    """``(stage, micro-batch, kind) -> seconds`` of its all-to-alls an action hides: on every device
    of schedule ``table``, consecutive forward and backward actions of different micro-batches pair
    up, left to right, each action in one pair at most, and a pair's :func:`pair_saving` is shared
    by its two actions in proportion to their own all-to-all time (never more than it: a pair saves
    at most its all-to-alls). ``layers``: each stage's :class:`MoELayerTimes` (None: no MoE block)."""
    out: dict[tuple[int, int, str], float] = {}
    for d in range(table.num_devices):
        row = [a for a in table[d] if a.kind in (FORWARD, BACKWARD)]
        i = 0
        while i + 1 < len(row):
            x, y = row[i], row[i + 1]
            if {x.kind, y.kind} == {FORWARD, BACKWARD} and x.microbatch != y.microbatch:
                f, b = (x, y) if x.kind == FORWARD else (y, x)
                lf, lb = layers[f.stage], layers[b.stage]
                if lf is not None and lb is not None:
                    n = min(lf.blocks, lb.blocks)
                    own_f, own_b = n * lf.comm_fwd, n * lb.comm_bwd
                    if own_f + own_b > 0:
                        saved = pair_saving(lf, lb)
                        out[(f.stage, f.microbatch, f.kind)] = saved * own_f / (own_f + own_b)
                        out[(b.stage, b.microbatch, b.kind)] = saved * own_b / (own_f + own_b)
                i += 2
            else:
                i += 1
    return out


def shortened(seconds: float, tp_s: float, saving: float) -> tuple[float, float]:
    """An action's (compute, collective) seconds with ``saving`` of its collectives hidden (the
    all-to-alls are in ``tp_s``; :func:`savings` never exceeds them)."""
    return seconds, max(0.0, tp_s - saving)
