"""The kernels eager PyTorch launches for a transformer block, counted by torch.profiler on the CPU.

A helper of ``test_eager_ops.py`` (and of ``scripts/eager_kernels.py``, which prints the table
``docs/model.md`` quotes): :func:`llama_layer` is a Llama decoder layer written as Hugging Face
transformers writes it (``modeling_llama.py``: ``LlamaRMSNorm``, ``rotate_half`` /
``apply_rotary_pos_emb``, ``repeat_kv``, SDPA attention, ``LlamaMLP``), the GPT block is the one
``scripts/gpu_step_bench.py`` timed on the H100/H200 (execute mode's block with Megatron-LM's
dropouts). :func:`profile_kernels` runs one forward and backward under ``torch.profiler`` with
``record_shapes`` and ``profile_memory`` and returns, per direction, every kernel-launching aten
op with the bytes it moves: its tensor inputs (as viewed) plus what it allocates (its outputs),
plus its first input again for an in-place op (written). A kernel is an aten op none of whose
callers is one, leaving out views, wrappers and allocations: what the CPU backend runs inside an
op (the internal casts of a mixed-dtype ``mul``, ``mean`` as ``sum`` then ``div_``) is one
kernel on a GPU, whose TensorIterator casts while it computes.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

#: aten ops that launch no kernel of their own: views, wrappers that dispatch to another op,
#: allocations
NOT_KERNELS = frozenset({
    "aten::to", "aten::linear", "aten::matmul", "aten::reshape", "aten::view", "aten::_unsafe_view",
    "aten::transpose", "aten::t", "aten::as_strided", "aten::slice", "aten::narrow", "aten::unsqueeze",
    "aten::squeeze", "aten::expand", "aten::empty", "aten::empty_like", "aten::empty_strided",
    "aten::resolve_conj", "aten::resolve_neg", "aten::result_type", "aten::detach", "aten::contiguous",
    "aten::chunk", "aten::split", "aten::split_with_sizes", "aten::flatten", "aten::permute", "aten::select",
    "aten::alias", "aten::dropout", "aten::scaled_dot_product_attention", "aten::expand_as", "aten::view_as",
    "aten::_reshape_alias", "aten::lift_fresh", "aten::type_as", "aten::softmax", "aten::gelu_",
    "aten::cross_entropy_loss", "aten::nll_loss_nd", "aten::nll_loss", "aten::log_softmax"})
#: GEMMs and the fused attention kernel: priced by FLOPs, not counted among the memory-bound kernels
GEMMS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm",
                   "aten::_scaled_dot_product_flash_attention_for_cpu",
                   "aten::_scaled_dot_product_flash_attention_for_cpu_backward"})


@dataclass(frozen=True)
class Kernel:
    name: str
    bytes: int
    gemm: bool


def _tensor_bytes(meta) -> int:
    if getattr(meta, "dtype", None) is None or getattr(meta, "sizes", None) is None or not list(meta.sizes):
        return 0  # not a tensor, or a 0-dim scalar
    return math.prod(meta.sizes) * torch.empty((), dtype=meta.dtype).element_size()


def _allocated(node) -> int:
    """Net bytes allocated under ``node``: the outputs it returns (temporaries are freed)."""
    own = node.typed[1].alloc_size if str(node.typed[0]).endswith("Allocation") else 0
    return own + sum(_allocated(c) for c in node.children)


def _moved(node) -> int:
    inputs = node.typed[1].inputs
    flat = [m for i in inputs for m in (i if isinstance(i, list) else [i])]
    moved = sum(_tensor_bytes(m) for m in flat) + _allocated(node)
    if node.name.endswith("_") and flat:  # in place: the first input is written too
        moved += _tensor_bytes(flat[0])
    return moved


def profile_kernels(fn) -> dict[str, list[Kernel]]:
    """``fn()`` runs a forward and a backward; the kernels of each (``fwd``, ``bwd``)."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True) as prof:
        fn()
    out: dict[str, list[Kernel]] = {"fwd": [], "bwd": []}

    def walk(node, phase: str):
        if not str(node.typed[0]).endswith("TorchOp"):
            return
        name = node.name
        if name.startswith("autograd::engine::evaluate_function"):
            phase = "bwd"
        if name.startswith("aten::") and name not in NOT_KERNELS:
            out[phase].append(Kernel(name, _moved(node), name in GEMMS))
            return
        for child in node.children:
            walk(child, phase)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root, "fwd")
    return out


# ------------------------------------------------------------------ a Llama layer, as HF writes it

class LlamaRMSNorm(nn.Module):
    """transformers ``LlamaRMSNorm``: upcast to fp32, ``x * rsqrt(mean(x^2) + eps)``, cast back, x weight."""

    def __init__(self, hidden: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin):
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def repeat_kv(hidden_states, n_rep: int):
    batch, kv_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, kv_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, kv_heads * n_rep, slen, head_dim)


class LlamaLayer(nn.Module):
    """transformers ``LlamaDecoderLayer`` with ``attn_implementation="sdpa"`` (no bias, no dropout)."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, ffn: int):
        super().__init__()
        self.head_dim, self.heads, self.kv_heads = hidden // heads, heads, kv_heads
        d = self.head_dim
        self.q_proj = nn.Linear(hidden, heads * d, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * d, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * d, bias=False)
        self.o_proj = nn.Linear(heads * d, hidden, bias=False)
        self.gate_proj = nn.Linear(hidden, ffn, bias=False)
        self.up_proj = nn.Linear(hidden, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, hidden, bias=False)
        self.input_layernorm = LlamaRMSNorm(hidden)
        self.post_attention_layernorm = LlamaRMSNorm(hidden)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        residual = x
        x = self.input_layernorm(x)
        shape = (b, s, -1, self.head_dim)
        q = self.q_proj(x).view(shape).transpose(1, 2)
        k = self.k_proj(x).view(shape).transpose(1, 2)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k = repeat_kv(k, self.heads // self.kv_heads)
        v = repeat_kv(v, self.heads // self.kv_heads)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = residual + self.o_proj(y.transpose(1, 2).contiguous().reshape(b, s, -1))
        residual = x
        x = self.post_attention_layernorm(x)
        x = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return residual + x


def rope(seq: int, head_dim: int, base: float = 10000.0):
    """``LlamaRotaryEmbedding``'s cos and sin, (1, seq, head_dim) in fp32."""
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = torch.arange(seq).float()[None, :, None] * inv
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


#: how a step runs: fp32 weights under bf16 autocast, fp32 throughout, or the weights themselves
#: in bf16 (``model.to(torch.bfloat16)``) without autocast
MODES = ("autocast", "fp32", "bf16")


def _autocast(mode: str):
    return torch.autocast("cpu", dtype=torch.bfloat16) if mode == "autocast" else contextlib.nullcontext()


def _dtype(mode: str):
    return torch.bfloat16 if mode == "bf16" else torch.float32


def llama_kernels(b: int, s: int, hidden: int, heads: int, kv_heads: int, ffn: int, mode: str):
    """Kernels of one Llama layer's forward and backward in ``mode`` (:data:`MODES`)."""
    torch.manual_seed(0)
    dtype = _dtype(mode)
    layer = LlamaLayer(hidden, heads, kv_heads, ffn).to(dtype)
    x = torch.randn(b, s, hidden, dtype=dtype, requires_grad=True)
    grad = torch.randn(b, s, hidden, dtype=dtype)
    cos, sin = (t.to(dtype) for t in rope(s, hidden // heads))  # LlamaRotaryEmbedding: x.dtype

    def step():
        with _autocast(mode):
            out = layer(x, cos, sin)
        out.backward(grad)

    return profile_kernels(step)


class _GpuDropout:
    """``torch.nn.functional`` with ``dropout`` as the op a CUDA tensor dispatches to."""

    def __getattr__(self, name):
        return getattr(F, name)

    @staticmethod
    def dropout(x, p, training=True):
        return torch.native_dropout(x, p, training)[0]


def gpt_kernels(b: int, s: int, hidden: int, heads: int, mode: str, flash: bool):
    """Kernels of one block of ``scripts/gpu_step_bench.py`` (execute mode's GPT block with
    Megatron-LM's dropouts; ``flash``: SDPA as its attention core, else scores, mask, softmax,
    dropout, weighted sum) in ``mode`` (:data:`MODES`; the bench's steps ran ``bf16``)."""
    import importlib.util
    from pathlib import Path

    from perfsim.models.transformer import arch_spec

    path = Path(__file__).resolve().parents[2] / "scripts" / "gpu_step_bench.py"
    loaded = importlib.util.spec_from_file_location("gpu_step_bench", path)
    bench = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(bench)
    # on a GPU, F.dropout is ONE kernel, native_dropout (output and a bool mask; ATen's dropout
    # takes it for CUDA tensors, ``is_fused_kernel_acceptable``), backward native_dropout_backward;
    # on the CPU it is bernoulli_, div_ and mul: the block is run with the GPU's op
    bench.F = _GpuDropout()
    torch.manual_seed(0)
    spec = arch_spec("gpt", "probe", n_layer=1, hidden=hidden, heads=heads, seq_len=s, vocab=64)
    dtype = _dtype(mode)
    block = bench.megatron_block(spec, 0.1, flash).to(dtype)
    x = torch.randn(b, s, hidden, dtype=dtype, requires_grad=True)
    grad = torch.randn(b, s, hidden, dtype=dtype)

    def step():
        with _autocast(mode):
            out = block(x)
        out.backward(grad)

    return profile_kernels(step)


def head_kernels(b: int, s: int, hidden: int, vocab: int, rms: bool, mode: str):
    """Kernels of a causal LM's head in ``mode``: the final norm (``LlamaRMSNorm`` or
    ``nn.LayerNorm``), the LM head (no bias) and transformers' ``ForCausalLMLoss`` (logits cast
    to fp32, labels shifted with ``pad``, ``cross_entropy``)."""
    torch.manual_seed(0)
    dtype = _dtype(mode)
    norm = (LlamaRMSNorm(hidden) if rms else nn.LayerNorm(hidden)).to(dtype)
    head = nn.Linear(hidden, vocab, bias=False).to(dtype)
    x = torch.randn(b, s, hidden, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, vocab, (b, s))
    seed = torch.ones(())

    def step():
        with _autocast(mode):
            logits = head(norm(x))
        logits = logits.float()
        shifted = F.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()
        F.cross_entropy(logits.view(-1, vocab), shifted.view(-1), ignore_index=-100).backward(seed)

    return profile_kernels(step)
