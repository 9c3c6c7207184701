"""Mamba-2: the state-space token mixer of hybrid models (IBM Granite 4.0-H).

A Mamba-2 layer (Dao and Gu, "Transformers are SSMs: Generalized Models and Efficient Algorithms
Through Structured State Space Duality", arXiv:2405.21060, Sec. 7-8) holds a ``head_dim x state_dim``
state per head, decayed by a scalar per head and token and written with the inputs' ``B`` and read
with their ``C`` projections (``groups`` of heads share them). As transformers' ``BambaMixer`` (used by
``GraniteMoeHybridMambaLayer``) and Megatron-Core's ``MambaMixer`` build it, one layer is:

* ``in_proj`` (``hidden -> 2 I + 2 G N + H``: the gate ``z``, the inputs ``x``, ``B`` and ``C``, and
  ``dt`` per head; ``I = heads x head_dim``), column parallel by head; ``out_proj`` (``I -> hidden``)
  row parallel;
* a causal depthwise convolution of ``conv_kernel`` taps with SiLU over ``x``, ``B``, ``C``
  (``I + 2 G N`` channels);
* the chunked scan of mamba_ssm's Triton kernels (``mamba_chunk_scan_combined``, chunks of
  :attr:`Mamba2.chunk` = 256 tokens; mamba_ssm ``ops/triton/ssd_combined.py``): the decays'
  cumulative sums, each chunk's final state (``B^T x``: ``2 C N P`` FLOPs a head), the state passing
  from chunk to chunk (sequential, element-wise over the ``N x P`` states: memory-bound), ``C B^T`` per
  group (``2 C^2 N``), and the output (``2 C P (C + N)`` a head: the intra-chunk product and the
  previous state read by ``C``). Its backward takes ``x``, ``dt``, ``B``, ``C`` and recomputes the
  chunk states, their passing and ``C B^T`` before the gradients;
* the gated RMSNorm (``norm(y) x silu(z)``, a weight of ``I``) before ``out_proj``.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfsim.errors import ConfigError
from perfsim.models.specs import check_positive_ints


@dataclass(frozen=True)
class Mamba2:
    """The shape of a Mamba-2 mixer (a config's ``mamba_*`` fields)."""

    #: heads (``mamba_n_heads``): one state each
    heads: int
    #: channels of a head (``mamba_d_head``, ``P``)
    head_dim: int
    #: the state's size per channel (``mamba_d_state``, ``N``)
    state_dim: int
    #: groups of heads sharing ``B`` and ``C`` (``mamba_n_groups``, ``G``)
    groups: int = 1
    #: taps of the causal depthwise convolution (``mamba_d_conv``)
    conv_kernel: int = 4
    #: tokens per chunk of the scan (``mamba_chunk_size``)
    chunk: int = 256
    #: the convolution has a bias per channel (``mamba_conv_bias``)
    conv_bias: bool = True
    #: ``in_proj`` and ``out_proj`` have biases (``mamba_proj_bias``)
    proj_bias: bool = False

    def __post_init__(self):
        check_positive_ints("Mamba-2", self, ("heads", "head_dim", "state_dim", "groups", "conv_kernel", "chunk"))
        if self.heads % self.groups:
            raise ConfigError(f"Mamba-2: groups={self.groups} must divide heads={self.heads}")

    @property
    def inner(self) -> int:
        """``I``: the inputs' (and gate's, and output's) width, ``heads x head_dim``."""
        return self.heads * self.head_dim

    @property
    def conv_width(self) -> int:
        """Channels of the convolution: ``x``, ``B`` and ``C``, ``I + 2 G N``."""
        return self.inner + 2 * self.groups * self.state_dim

    def gemms(self, hidden: int) -> tuple[tuple[str, int, int], ...]:
        """``(name, k, n)`` of the mixer's GEMMs, all ranks together."""
        return (("mamba_in_proj", hidden, self.inner + self.conv_width + self.heads),
                ("mamba_out_proj", self.inner, hidden))

    def gemm_weights(self, hidden: int) -> int:
        """Weights of :meth:`gemms`."""
        return sum(k * n for _, k, n in self.gemms(hidden))

    def replicated_params(self) -> int:
        """Parameters every tensor-parallel rank holds whole: none (the norm's weight is split with
        the heads, Megatron-Core's per-rank group norm); ``out_proj``'s bias is counted by
        :meth:`row_bias`."""
        return 0

    def row_bias(self, hidden: int) -> int:
        """``out_proj``'s bias (with ``proj_bias``): whole on every rank, as a row-parallel layer's."""
        return hidden if self.proj_bias else 0

    def params(self, hidden: int) -> int:
        """Every parameter of the mixer: the GEMMs (and their biases), the convolution's taps (and
        bias), ``dt_bias``, ``A_log`` and ``D`` per head and the gated norm's weight."""
        biases = (self.inner + self.conv_width + self.heads + hidden) if self.proj_bias else 0
        return (self.gemm_weights(hidden) + biases + self.conv_width * (self.conv_kernel + self.conv_bias)
                + 3 * self.heads + self.inner)

    def core_flops(self, tokens: int) -> float:
        """Forward FLOPs of the chunked scan over ``tokens`` of one sequence (module docstring): per chunk
        ``H (2 C N P + 2 C P (C + N)) + G 2 C^2 N``."""
        c, n, p = self.chunk, self.state_dim, self.head_dim
        chunks = -(-tokens // c)
        return float(chunks * (self.heads * (2 * c * n * p + 2 * c * p * (c + n)) + self.groups * 2 * c * c * n))

    def check_tp(self, tp: int) -> None:
        """Tensor parallelism splits the heads and the groups of ``B`` and ``C`` (Megatron-Core's
        ``MambaMixer``: ``ngroups`` must divide by the tensor-parallel size)."""
        for what, n in (("heads", self.heads), ("groups", self.groups)):
            if n % tp:
                raise ConfigError(f"tp={tp}: does not divide the Mamba-2 {what}={n} (Megatron-Core splits both)")

    def check_cp(self, tp: int, cp: int) -> None:
        """Context parallelism gives each of the ``cp`` ranks the whole sequence of ``1 / cp`` of a tensor
        rank's heads and groups (Megatron-Core's ``MambaContextParallel``): both must split."""
        for what, n in (("heads", self.heads), ("groups", self.groups)):
            if n % (tp * cp):
                raise ConfigError(f"cp={cp}: the Mamba-2 {what}={n} do not split over tp x cp = {tp * cp} ranks "
                                  "(Megatron-Core gives each context-parallel rank its share of a tensor rank's)")

    def cp_exchanges(self, tokens: int, tp: int, bpv: int) -> tuple[float, float]:
        """Bytes of one rank's two all-to-alls around the convolution and scan under context parallelism
        (Megatron-Core's ``MambaContextParallel``: ``pre_conv_ssm`` trades the rank's ``tokens`` of
        ``in_proj``'s output -- ``z``, ``x``, ``B``, ``C``, ``dt`` -- for the whole sequence of its share of
        the heads, ``post_conv_ssm`` trades the scan's output back), each rank's buffer."""
        return (float(tokens * (self.inner + self.conv_width + self.heads) // tp * bpv),
                float(tokens * self.inner // tp * bpv))

    def activation_bytes(self, tokens: int, tp: int, bpv: int) -> float:
        """Bytes one rank's mixer keeps for the backward over ``tokens``: the convolution's input and output
        (``I + 2 G N`` each), the gate ``z``, the scan's and the norm's outputs (``I`` each), and ``dt``
        per head in fp32."""
        return float(tokens * (bpv * (2 * self.conv_width + 3 * self.inner) // tp + 4 * self.heads // tp))

    def ops(self, mb: int, seq: int, hidden: int, tp: int, bpv: int) -> list:
        """Forward ops of the mixer on one tensor-parallel rank for ``mb`` sequences of ``seq`` tokens."""
        from perfsim.models.ops import Op  # lazy: import perfsim does not load perfsim.models.ops

        tok = mb * seq
        heads, groups, inner = self.heads // tp, self.groups // tp, self.inner // tp
        c, n, p = self.chunk, self.state_dim, self.head_dim
        chunks = mb * -(-seq // c)  # (sequence, chunk) pairs
        return [
            Op("mamba_in_proj", m=tok, n=(self.inner + self.conv_width + self.heads) // tp, k=hidden),
            Op("mamba_conv", bytes=2 * bpv * tok * self.conv_width // tp),
            # dt's softplus and the decays' cumulative sums per chunk, written in fp32
            Op("mamba_dt", bytes=(bpv + 8) * tok * heads, bwd_recompute=True),
            # each chunk's final state B^T x, per head; recomputed in the backward
            Op("mamba_chunk_state", m=n, n=p, k=c, batch=chunks * heads, bwd_recompute=True),
            # the states passed chunk to chunk: read fp32, written in the inputs' precision
            Op("mamba_state_passing", bytes=(4 + bpv) * n * p * heads * chunks, bwd_recompute=True),
            Op("mamba_bmm", m=c, n=c, k=n, batch=chunks * groups, bwd_recompute=True),
            # the output: the intra-chunk product and the previous state read by C
            Op("mamba_chunk_scan", m=c, n=p, k=c + n, batch=chunks * heads),
            Op("mamba_norm_gate", bytes=3 * bpv * tok * inner),
            Op("mamba_out_proj", m=tok, n=hidden, k=inner),
        ]

    def describe(self) -> str:
        """The model note's words for this mixer."""
        return (f"Mamba-2 ({self.heads} heads of {self.head_dim}, state {self.state_dim}, {self.groups} group(s)): "
                "the chunked scan priced from its kernels' FLOPs and bytes; no Mamba kernel was timed, so its interval is "
                "that of standard-attention rows")
