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

Not modelled, and refused by name: sliding-window or chunked attention, an encoder, attention
kernels other than flash (Megatron-Core runs context parallelism through Transformer Engine's),
a profile's measured layer times (they are of the whole sequence), the all-gather flavour
(``--cp-comm-type all_gather``), Ulysses' all-to-all (DeepSpeed). The two key/value buffers of the
ring (``2 x`` a shard's keys and values) are not added to the memory.
"""

from __future__ import annotations

from perfsim.engine.compute import flash_time
from perfsim.engine.group_times import _alike, _shape_key
from perfsim.errors import ConfigError
from perfsim.hardware import BYTES_PER_VALUE, curve_for
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
    if arch.seq_len % (2 * cp):
        raise ConfigError(f"cp={cp}: seq_len={arch.seq_len} must split into 2 x cp = {2 * cp} equal chunks "
                          "(the load-balanced causal split)")
    if strategy.sequence_parallel and (arch.seq_len // cp) % strategy.tp:
        raise ConfigError(f"cp={cp}: a rank's {arch.seq_len // cp} tokens do not split over tp={strategy.tp} "
                          "under sequence parallelism")
    arch.context_shard(cp)  # a window, chunks or an encoder: refused by the spec, naming them


def cp_stage_times(workload, strategy, network, s: int, blocks: int, gpu, host_s: float = 0.0
                   ) -> tuple[float, float, float]:
    """(fwd s, bwd s, bytes one GPU sends) of the context-parallel ring of ``blocks`` blocks of pipeline
    device ``s`` for one micro-batch (module docstring), on the slowest context-parallel group;
    ``workload`` is the engine's per-rank one (:meth:`perfsim.config.Workload.context_rank`). With full recomputation the
    forward's ring runs again in the backward."""
    cp, spec = strategy.cp, workload.arch
    if cp == 1 or spec is None or not blocks:
        return 0.0, 0.0, 0.0
    bpv = BYTES_PER_VALUE[strategy.precision]
    k_width = rank_kv_width(spec, strategy.tp)  # this tensor rank's keys; its values (MLA's narrower)
    shard = float(strategy.micro_batch * spec.seq_len * (k_width + k_width * spec.v_head_dim // spec.head_dim) * bpv)
    curve = curve_for(gpu)[0]
    attn = next(op for op in block_ops(spec, strategy.micro_batch, strategy.tp, strategy.sequence_parallel, bpv,
                                       "flash", block=0) if op.flash)
    steps = (cp - 1) / cp  # the attention steps an exchange can hide behind
    ring_f = ring_b = 0.0
    seen = set()
    for t in range(strategy.tp):  # each tensor rank's group, among the data-parallel replicas alike
        for g in _alike(strategy, network, lambda q: strategy.device(t, q * cp, s), strategy.dp, None):
            members = [strategy.device(t, g * cp + c, s) for c in range(cp)]
            key = _shape_key(network, members)
            if key in seen:
                continue
            seen.add(key)
            ring_f = max(ring_f, max(host_s, network.collective_time("allgather", shard, members, lockstep=True)))
            ring_b = max(ring_b, max(host_s, network.collective_time("allgather", 2 * shard, members,
                                                                     lockstep=True)))
    fwd = blocks * max(0.0, ring_f - steps * flash_time(attn, gpu, strategy.precision, curve))
    bwd = blocks * max(0.0, ring_b - steps * flash_time(attn, gpu, strategy.precision, curve, backward=True))
    sent = blocks * (collective_cost("allgather", shard, cp)[0] + collective_cost("allgather", 2 * shard, cp)[0])
    if strategy.recompute == "full":
        bwd += fwd
        sent += blocks * collective_cost("allgather", shard, cp)[0]
    return fwd, bwd, sent
