"""Context parallelism (``Strategy.cp``): every sequence split over ``cp`` ranks.

As Megatron-Core runs it (``--context-parallel-size``, ``--cp-comm-type p2p``; Transformer Engine's
``attn_forward_func_with_cp``), after Liu et al., "Ring Attention with Blockwise Transformers",
arXiv:2310.01889; Llama 3 trained its long-context stage so (Llama Team, arXiv:2407.21783,
Sec. 3.3.2):

* **What a rank computes.** The sequence is cut into ``2 cp`` chunks, rank ``i`` holding chunks ``i``
  and ``2 cp - 1 - i``, so under the causal mask every rank has the same share of the (query, key)
  pairs. Every token-wise operator (GEMMs, norms, the MLP, the loss) runs on the rank's
  ``seq_len / cp`` tokens; its attention computes its queries against the whole sequence's keys,
  ``1 / cp`` of the pairs: the model's view ``TransformerSpec.context_shard`` (``context_shards``),
  priced as any block (:mod:`perfsim.engine.compute`). Activations, tensor-parallel collectives,
  pipeline messages and the experts' all-to-alls are the shard's.
* **What it sends** (:func:`cp_stage_times`). Per block, forward, the ranks pass their keys and values
  around the ring, ``cp - 1`` exchanges of one shard's (this tensor rank's heads), each beside one
  step of the attention; backward the keys and values again and their gradients. A step's exchange
  is hidden behind its attention step unless slower: the block pays
  ``max(0, t_ring - (cp - 1) / cp x t_attention)``, the ring timed as an all-gather of each rank's
  shard on the context-parallel group's own GPUs (the network's collective: ``cp - 1`` steps of one
  shard, :mod:`perfsim.collectives`).
* **Gradients.** The ``cp`` ranks hold the same weights and reduce their gradients with the
  data-parallel replicas' (Megatron-Core's data-and-context-parallel group): the engine's replicas
  are ``dp x cp`` (:attr:`perfsim.config.Strategy.replicas`), the context-parallel ranks of a group
  consecutive, next to the tensor ranks (Megatron-Core's tp-cp-dp-pp order); ZeRO shards and the
  expert-parallel group span them too.

* **Mamba-2 blocks** (Granite 4.0-H, Nemotron-H; Megatron-Core's ``MambaContextParallel``): the rank
  runs ``in_proj`` on its tokens, an all-to-all trades them for the whole sequence of ``1 / cp`` of its
  heads (``z``, ``x``, ``B``, ``C``, ``dt``), the convolution and scan run there, and a second all-to-all
  trades the output back before ``out_proj``; both exposed, and again for the gradients. The scan's
  work is the same per rank (tokens x heads), priced as the shard's. Blocks of an MLP alone send nothing.

Not modelled, and refused by name: sliding-window or chunked attention, an encoder, attention
kernels other than flash (Megatron-Core runs context parallelism through Transformer Engine's),
a profile's measured layer times (they are of the whole sequence), the all-gather flavour
(``--cp-comm-type all_gather``), Ulysses' all-to-all (DeepSpeed). The two key/value buffers of the
ring (``2 x`` a shard's keys and values) are not added to the memory.
"""

from __future__ import annotations

from perfsim.engine.compute import flash_time
from perfsim.engine.group_times import replica_groups
from perfsim.errors import ConfigError
from perfsim.hardware import BYTES_PER_VALUE, curve_for
from perfsim.models.mamba2 import Mamba2
from perfsim.models.ops import block_ops, rank_kv_width
from perfsim.network import collective_cost


def check_context_parallel(arch, strategy, gpu, name: str = "") -> None:
    """ConfigError naming ``cp`` unless this job's context parallelism is modelled (module docstring)."""
    cp = strategy.cp
    if cp == 1:
        return
    if arch is None:
        raise ConfigError(f"cp={cp}: context parallelism splits a transformer's sequences, not {name!r}'s")
    if gpu is None:
        raise ConfigError(f"cp={cp}: context parallelism is priced from a GPU preset's kernels; give --gpu "
                          "(a profile's layer times are of the whole sequence)")
    if strategy.attention != "flash":
        raise ConfigError(f"cp={cp} with attention={strategy.attention}: Megatron-Core runs context parallelism "
                          "through Transformer Engine's flash kernels; use --attention flash (16-bit: --precision bf16)")
    if isinstance(arch.linear_mixer, Mamba2):  # its heads and groups split over the context-parallel ranks too
        arch.linear_mixer.check_cp(strategy.tp, cp)
    if arch.seq_len % (2 * cp):
        raise ConfigError(f"cp={cp}: seq_len={arch.seq_len} must split into 2 x cp = {2 * cp} equal chunks "
                          "(the load-balanced causal split)")
    if strategy.sequence_parallel and (arch.seq_len // cp) % strategy.tp:
        raise ConfigError(f"cp={cp}: a rank's {arch.seq_len // cp} tokens do not split over tp={strategy.tp} "
                          "under sequence parallelism")
    comm = strategy.cp_comm
    if comm == "a2a":  # Ulysses trades sequence shards for head shards: the rank's heads must split cp ways
        heads, kv_heads = arch.heads // strategy.tp, max(1, arch.kv_heads // strategy.tp)
        if heads % cp or kv_heads % cp:
            raise ConfigError(f"cp={cp} with cp_comm=a2a: a tensor rank's {heads} query and {kv_heads} key/value "
                              f"heads must split {cp} ways (DeepSpeed-Ulysses); use cp_comm=p2p")
    arch.context_shard(cp)  # a window, chunks or an encoder: refused by the spec, naming them


def cp_collectives(spec, strategy) -> list[tuple[str, str, float, bool]]:
    """One block's context-parallel collectives for one micro-batch on one rank, as ``(phase, kind,
    bytes, hidden)``: ``kind`` and ``bytes`` in :func:`perfsim.collectives.plan`'s terms (an all-gather's
    bytes are each rank's contribution, a reduce-scatter's and an all-to-all's each rank's buffer),
    ``hidden``: it runs beside the attention's steps (the ring). ``spec`` is the rank's shard.

    * ``p2p`` (Transformer Engine's ``AttnFuncWithCPAndKVP2P``; Ring Attention, arXiv:2310.01889):
      forward ``cp - 1`` steps of one shard's keys and values, an all-gather's bytes; backward the
      keys and values again and their gradients (twice the bytes); each step beside an attention step;
    * ``allgather`` (``AttnFuncWithCPAndKVAllGather``; Llama 3, arXiv:2407.21783 Sec. 3.3.2: "the
      all-gather communication latency is exposed in the critical path"): forward an all-gather of the
      keys and values before the attention; backward the same all-gather again and a reduce-scatter of
      the whole sequence's key and value gradients, all exposed;
    * ``a2a`` (``AttnFuncWithCPAndQKVOA2A``; Jacobs et al., "DeepSpeed Ulysses", arXiv:2309.14509,
      Sec. 3): an all-to-all of the queries, keys and values (sequence shards for head shards) before
      the attention and of its output after it; backward the same four of their gradients, exposed."""
    cp, bpv = strategy.cp, BYTES_PER_VALUE[strategy.precision]
    k_width = rank_kv_width(spec, strategy.tp)  # this tensor rank's keys; its values (MLA's narrower)
    kv = float(strategy.micro_batch * spec.seq_len * (k_width + k_width * spec.v_head_dim // spec.head_dim) * bpv)
    comm = strategy.cp_comm
    if comm == "p2p":
        return [("fwd", "allgather", kv, True), ("bwd", "allgather", 2 * kv, True)]
    if comm == "allgather":
        return [("fwd", "allgather", kv, False), ("bwd", "allgather", kv, False),
                ("bwd", "reduce_scatter", cp * kv, False)]
    q = float(strategy.micro_batch * spec.seq_len * spec.q_dim // strategy.tp * bpv)
    out = float(strategy.micro_batch * spec.seq_len * spec.out_dim // strategy.tp * bpv)
    return [(ph, "alltoall", n, False) for ph in ("fwd", "bwd") for n in (q + kv, out)]


def mamba_cp_collectives(spec, strategy) -> list[tuple[str, str, float, bool]]:
    """One Mamba-2 block's context-parallel collectives for one micro-batch on one rank, in
    :func:`cp_collectives`' terms: the two all-to-alls around the convolution and scan
    (:meth:`perfsim.models.mamba2.Mamba2.cp_exchanges`), forward and backward, exposed."""
    pre, post = spec.linear_mixer.cp_exchanges(strategy.micro_batch * spec.seq_len, strategy.tp,
                                                BYTES_PER_VALUE[strategy.precision])
    return [(ph, "alltoall", n, False) for ph in ("fwd", "bwd") for n in (pre, post)]


def cp_stage_times(workload, strategy, network, s: int, blocks: int, gpu, host_s: float = 0.0,
                   block_ids: tuple[int, ...] = ()) -> tuple[float, float, float]:
    """(fwd s, bwd s, bytes one GPU sends) of the context-parallel exchanges of ``blocks`` blocks of
    pipeline device ``s`` for one micro-batch (:func:`cp_collectives`), on the slowest context-parallel
    group; ``workload`` is the engine's per-rank one (:meth:`perfsim.config.Workload.context_rank`). The
    ring's exchanges hide behind the attention's steps but for ``max(0, t_ring - (cp - 1)/cp x
    t_attention)``; the other flavours' are exposed. With full recomputation the forward's run again
    in the backward. ``block_ids``: the blocks' indices, which a hybrid model needs (its Mamba-2 blocks
    send :func:`mamba_cp_collectives`, its MLP-only blocks nothing)."""
    cp, spec = strategy.cp, workload.arch
    if cp == 1 or spec is None or not blocks:
        return 0.0, 0.0, 0.0
    counts = {"attention": blocks, "mamba": 0}
    if spec.linear_attention_layers or spec.mixer_free_layers:
        if len(block_ids) != blocks:
            raise ValueError(f"cp_stage_times: {blocks} blocks but {len(block_ids)} block ids")
        counts = {"attention": sum(1 for i in block_ids if spec.has_mixer(i) and not spec.is_linear_block(i)),
                  "mamba": sum(1 for i in block_ids if spec.is_linear_block(i))}
    fwd = bwd = sent = 0.0
    for kind, n in counts.items():
        if not n:
            continue
        if kind == "mamba":
            colls, behind = mamba_cp_collectives(spec, strategy), {"fwd": 0.0, "bwd": 0.0}
        else:
            colls = cp_collectives(spec, strategy)
            curve = curve_for(gpu)[0]
            first = next(i for i in spec.all_blocks if spec.has_mixer(i) and not spec.is_linear_block(i))
            attn = next(op for op in block_ops(spec, strategy.micro_batch, strategy.tp, strategy.sequence_parallel,
                                               BYTES_PER_VALUE[strategy.precision], "flash", block=first) if op.flash)
            behind = {"fwd": (cp - 1) / cp * flash_time(attn, gpu, strategy.precision, curve),  # the ring's overlap
                      "bwd": (cp - 1) / cp * flash_time(attn, gpu, strategy.precision, curve, backward=True)}
        f, b, nbytes = _exchanges(strategy, network, s, colls, behind, host_s)
        fwd, bwd, sent = fwd + n * f, bwd + n * b, sent + n * nbytes
    return fwd, bwd, sent


def _exchanges(strategy, network, s: int, colls, behind: dict, host_s: float) -> tuple[float, float, float]:
    """(fwd s, bwd s, bytes) of one block's context-parallel ``colls`` on the slowest group of device ``s``:
    the hidden ones behind ``behind`` seconds of attention, the others exposed; with full recomputation the
    forward's again in the backward."""
    cp = strategy.cp
    worst = {"fwd": 0.0, "bwd": 0.0}
    for members in replica_groups(strategy, network, s, cp):  # each group of cp consecutive replicas
        for phase in worst:
            timed = [(max(host_s, network.collective_time(kind, n, members, lockstep=True)), hidden)
                     for ph, kind, n, hidden in colls if ph == phase]
            exposed = (max(0.0, sum(x for x, h in timed if h) - behind[phase])
                       + sum(x for x, h in timed if not h))
            worst[phase] = max(worst[phase], exposed)
    fwd, bwd = worst["fwd"], worst["bwd"]
    sent = sum(collective_cost(kind, n, cp)[0] for _, kind, n, _ in colls)
    if strategy.recompute == "full":
        bwd += fwd
        sent += sum(collective_cost(kind, n, cp)[0] for ph, kind, n, _ in colls if ph == "fwd")
    return fwd, bwd, sent
