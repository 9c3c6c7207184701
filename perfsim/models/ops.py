"""The operator vocabulary of a forward pass: what a model is made of, for the compute model.

Models (:mod:`perfsim.models`) list their layers' kernels as :class:`Op` values; the
engine prices them (:func:`perfsim.engine.compute.op_time`: roofline x efficiency curve,
or a profile's measured rates).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Op:
    """One kernel of a forward pass: a GEMM (``m, n, k``, ``batch`` copies) or a
    memory-bound op (``bytes`` moved)."""

    name: str
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 1
    bytes: float = 0.0
    attention_core: bool = False  # recomputed by selective recomputation
    #: backward as one memory-bound kernel moving these bytes, instead of twice the
    #: forward (None); an op with no forward work (``bytes`` 0, not a GEMM) is backward-only
    bwd_bytes: float | None = None
    #: FlashAttention-2's fused kernel over ``batch`` (micro-batch x heads) sequences of
    #: ``m`` queries and ``n`` keys, head dimension ``k`` (:func:`flash_time`)
    flash: bool = False
    #: a causal mask: the kernel skips the upper half of the score matrix
    causal: bool = True
    #: the LM head's vocabulary projection (its rate: ``Curve.lm_head_eff``)
    lm_head: bool = False

    @property
    def flops(self) -> float:
        """GEMM FLOPs; flash attention: the forward's two GEMMs, as FlashAttention counts
        them (``4 b h s^2 d``, halved by a causal mask)."""
        if self.flash:
            return 4.0 * self.m * self.n * self.k * self.batch * (0.5 if self.causal else 1.0)
        return 2.0 * self.m * self.n * self.k * self.batch
