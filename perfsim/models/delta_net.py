"""Gated DeltaNet: the linear-attention token mixer of hybrid models (Qwen3-Next).

A Gated DeltaNet block replaces softmax attention by a recurrence over a ``key_dim x value_dim``
state per value head, updated by the gated delta rule ``S_t = a_t S_{t-1} (I - b_t k_t k_t^T) +
b_t k_t v_t^T``, read by ``o_t = S_t^T q_t`` (Yang, Kautz and Hatamizadeh, "Gated Delta Networks:
Improving Mamba2 with Delta Rule", arXiv:2412.06464, Sec. 3). Qwen3-Next interleaves three such
blocks with one gated-attention block (Qwen Team, "Qwen3-Next", 2025; transformers'
``modeling_qwen3_next.py``, ``Qwen3NextGatedDeltaNet``), whose layer this module prices:

* ``in_proj_qkvz`` (``hidden -> 2 K + 2 V``: queries, keys, values and the output gate ``z``) and
  ``in_proj_ba`` (``hidden -> 2 H_v``: the write strength ``b`` and the decay input ``a``), column
  parallel by head under tensor parallelism; ``out_proj`` (``V -> hidden``) row parallel; ``K =
  key_heads x key_dim``, ``V = value_heads x value_dim``;
* a causal depthwise convolution of width ``conv_kernel`` with SiLU over the ``2 K + V`` query,
  key and value channels (Dao-AILab causal-conv1d's fused kernel);
* the decay ``g = -exp(A_log) softplus(a + dt_bias)`` and ``beta = sigmoid(b)`` per value head;
  the L2 norm of every query and key head (``use_qk_l2norm_in_kernel``);
* the chunked delta rule as flash-linear-attention runs it (``chunk_gated_delta_rule``, chunks of
  :attr:`GatedDeltaNet.chunk` = 64 tokens; fla ``fla/ops/gated_delta_rule/chunk.py`` and
  ``fla/ops/common/chunk_delta_h.py``): within each chunk, in parallel over chunks, the WY
  representation (``beta K K^T``, its triangular inverse, ``w`` and ``u``) and the intra-chunk
  output (``Q K^T`` masked, times the new values); across chunks, *sequentially*, the state pass
  (``v_new = u - w S``, ``S <- S a + K^T v_new``) -- one thread block per (sequence, value head,
  value tile of 64 on Hopper, 32 on Ampere), so with few heads per rank it occupies few SMs --
  and the inter-chunk output ``Q S`` in parallel; the per-chunk states are stored (bf16) for the
  output kernel. Its backward recomputes ``w``, ``u`` and the states before the gradient kernels;
* the gated RMSNorm of the output (``norm(o) x silu(z)``, a weight of ``value_dim``).
"""

from __future__ import annotations

from dataclasses import dataclass

from perfsim.errors import ConfigError
from perfsim.models.specs import check_positive_ints

#: flash-linear-attention's value tile of the state kernels on Hopper (``BV = 64`` for compute
#: capability >= 9; 32 on the A100): one thread block per tile, sequence and value head
STATE_VALUE_TILE = 64


@dataclass(frozen=True)
class GatedDeltaNet:
    """The shape of a Gated DeltaNet mixer (a config's ``linear_*`` fields)."""

    #: query/key heads (``linear_num_key_heads``); each serves ``value_heads / key_heads`` value heads
    key_heads: int
    #: value heads (``linear_num_value_heads``): one recurrent state each
    value_heads: int
    #: width of a query/key head (``linear_key_head_dim``)
    key_dim: int
    #: width of a value head (``linear_value_head_dim``)
    value_dim: int
    #: taps of the causal depthwise convolution (``linear_conv_kernel_dim``)
    conv_kernel: int = 4
    #: tokens per chunk of the chunked delta rule (flash-linear-attention's 64)
    chunk: int = 64

    def __post_init__(self):
        check_positive_ints("Gated DeltaNet", self, ("key_heads", "value_heads", "key_dim", "value_dim",
                                                     "conv_kernel", "chunk"))
        if self.value_heads % self.key_heads:
            raise ConfigError(f"Gated DeltaNet: key_heads={self.key_heads} must divide value_heads={self.value_heads}")

    @property
    def key_width(self) -> int:
        """``K``: the queries' (and keys') width, ``key_heads x key_dim``."""
        return self.key_heads * self.key_dim

    @property
    def value_width(self) -> int:
        """``V``: the values' (and the output's and gate's) width, ``value_heads x value_dim``."""
        return self.value_heads * self.value_dim

    @property
    def conv_width(self) -> int:
        """Channels of the convolution: queries, keys and values, ``2 K + V``."""
        return 2 * self.key_width + self.value_width

    def gemms(self, hidden: int) -> tuple[tuple[str, int, int], ...]:
        """``(name, k, n)`` of the mixer's GEMMs, all ranks together: the two input projections and
        the output projection."""
        return (("delta_in_proj", hidden, 2 * self.key_width + 2 * self.value_width),
                ("delta_gate_proj", hidden, 2 * self.value_heads),
                ("delta_out_proj", self.value_width, hidden))

    def gemm_weights(self, hidden: int) -> int:
        """Weights of :meth:`gemms`."""
        return sum(k * n for _, k, n in self.gemms(hidden))

    def replicated_params(self) -> int:
        """Parameters every tensor-parallel rank holds whole: the gated norm's weight (one head's
        width, shared by the heads)."""
        return self.value_dim

    def row_bias(self, hidden: int) -> int:
        """A row-parallel bias (whole on every rank): none, ``out_proj`` has no bias."""
        return 0

    def describe(self) -> str:
        """The model note's words for this mixer."""
        return (f"Gated DeltaNet ({self.key_heads} query/key and {self.value_heads} value heads of {self.key_dim}/"
                f"{self.value_dim}): the chunked delta rule priced from its kernels' FLOPs and bytes, its state pass "
                "by the SMs its thread blocks fill; no Gated DeltaNet kernel was timed, so its interval is that of "
                "standard-attention rows")

    def params(self, hidden: int) -> int:
        """Every parameter of the mixer: the GEMMs, the convolution's taps (no bias), ``A_log`` and
        ``dt_bias`` per value head and the gated norm's weight."""
        return (self.gemm_weights(hidden) + self.conv_width * self.conv_kernel + 2 * self.value_heads
                + self.replicated_params())

    def core_flops(self, tokens: int) -> float:
        """Forward FLOPs of the chunked delta rule over ``tokens`` of one sequence, all value heads:
        per chunk of ``C`` and value head the WY representation and intra-chunk output
        (``2 C^2 (3 d_k + 2 d_v)``), the state pass and the inter-chunk output (``3 x 2 C d_k d_v``)."""
        c, dk, dv = self.chunk, self.key_dim, self.value_dim
        chunks = -(-tokens // c)
        return float(chunks * self.value_heads * (2 * c * c * (3 * dk + 2 * dv) + 6 * c * dk * dv))

    def check_tp(self, tp: int) -> None:
        """Tensor parallelism splits the mixer by query/key head (each rank its heads' values)."""
        if self.key_heads % tp:
            raise ConfigError(f"tp={tp}: does not divide the Gated DeltaNet's key_heads={self.key_heads}")

    def activation_bytes(self, tokens: int, tp: int, bpv: int) -> float:
        """Bytes one rank's mixer keeps for the backward over ``tokens``: the convolution's input and
        output (``2 K + V`` each), the output gate ``z``, the rule's output and the gated norm's
        output (``V`` each), and flash-linear-attention's saved decays and write strengths (fp32, per
        value head) and WY matrix ``A`` (fp32, ``C`` per token and value head)."""
        heads = self.value_heads // tp
        values = 2 * self.conv_width // tp + 3 * self.value_width // tp
        return float(tokens * (bpv * values + 4 * heads * (2 + self.chunk)))

    def ops(self, mb: int, seq: int, hidden: int, tp: int, bpv: int) -> list:
        """Forward ops of the mixer on one tensor-parallel rank for ``mb`` sequences of ``seq``
        tokens (module docstring), from the input projections to the output projection."""
        from perfsim.models.ops import Op  # lazy: import perfsim does not load perfsim.models.ops

        tok = mb * seq
        heads = self.value_heads // tp
        k_w, v_w = self.key_width // tp, self.value_width // tp
        c, dk, dv = self.chunk, self.key_dim, self.value_dim
        seqs = mb * heads * -(-seq // c)  # (sequence, value head, chunk) triples
        repeat = self.value_heads // self.key_heads
        return [
            Op("delta_in_proj", m=tok, n=2 * k_w + 2 * v_w, k=hidden),
            Op("delta_gate_proj", m=tok, n=2 * heads, k=hidden),
            Op("delta_conv", bytes=2 * bpv * tok * (2 * k_w + v_w)),
            # g and beta per value head, written in fp32
            Op("delta_decay", bytes=(2 * bpv + 8) * tok * heads),
            # queries and keys: L2-normalised, then (query/key heads serving several value heads) repeated
            Op("delta_qk_l2norm", bytes=2 * bpv * tok * 2 * k_w),
            *([Op("delta_qk_repeat", bytes=bpv * tok * 2 * k_w * (1 + repeat))] if repeat > 1 else []),
            # WY representation and intra-chunk output, in parallel over chunks; recomputed in the backward
            Op("delta_chunk_local", m=c, n=c, k=3 * dk + 2 * dv, batch=seqs, bwd_recompute=True),
            Op("delta_solve_tril", bytes=(4 + bpv) * c * c * seqs, bwd_recompute=True),
            # the state pass: chunk after chunk, one thread block per (sequence, head, value tile)
            Op("delta_chunk_state", m=c, n=dv, k=2 * dk, batch=seqs, bwd_recompute=True,
               ctas=mb * heads * -(-dv // STATE_VALUE_TILE)),
            # the chunk states written by the state pass and read by the output kernel, the new values written
            Op("delta_state_store", bytes=bpv * (2 * dk * dv * seqs + tok * v_w), bwd_recompute=True),
            Op("delta_chunk_inter", m=c, n=dv, k=dk, batch=seqs),
            # norm(o) x silu(z): read o and z, write the product
            Op("delta_norm_gate", bytes=3 * bpv * tok * v_w),
            Op("delta_out_proj", m=tok, n=hidden, k=v_w),
        ]
