"""A tied LM head in execute mode (``perfsim run --tied-embedding sync``), Megatron's way.

GPT-2 ties its LM head to the token embedding. When the first and the last
pipeline stage are different ranks, Megatron-LM (Shoeybi et al., arXiv:1909.08053;
``megatron/model/module.py`` ``initialize_word_embeddings`` and the embedding
all-reduce after the data-parallel sync in ``megatron/training.py``) gives the last
stage its own copy of the embedding, initialised equal, and after every step's
data-parallel gradient sync all-reduces (sums) the two copies' gradients over a
group of those two ranks, so both take the same optimizer step and stay equal. The
simulator prices exactly that all-reduce (:func:`perfsim.engine.plan.tied_sync_bytes`).

Here the copy is the head's ``lm_head.weight`` (``vocab x d``, the token table's
shape), initialised from the embedding's table (:mod:`perfsim.runtime.models`).
Where one rank holds both (``pp = 1``, or a schedule that puts the last chunk on the
first rank) the two gradients are summed in place and nothing is sent. Only
``tp = 1``: under tensor parallelism execute mode replicates the embedding on every
TP rank (Megatron shards it by vocabulary), so the bytes would not be Megatron's.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from perfsim.network import collective_cost


def embedding_table(stage) -> torch.nn.Parameter:
    """The token table of the stage that holds the embedding (layer 0)."""
    return stage.layers[0].tok.weight


def head_table(stage) -> torch.nn.Parameter:
    """The LM head's weight of the stage that holds the head (the last layer)."""
    return stage.layers[-1].lm_head.weight


class TiedEmbedding:
    """The all-reduce of the tied embedding's gradient between the rank of the first
    stage and the rank of the last stage of each replica.

    Every rank must construct it, in the same order relative to its other
    ``new_group`` calls (torch.distributed creates groups collectively).
    """

    def __init__(self, stages: dict, num_stages: int, first_rank_of, last_rank_of, replicas: int,
                 replica: int):
        #: this rank's copies: the embedding's table and / or the head's weight
        self.tables = []
        if 0 in stages:
            self.tables.append(embedding_table(stages[0]))
        if num_stages - 1 in stages:
            self.tables.append(head_table(stages[num_stages - 1]))
        self.group = None
        for r in range(replicas):
            pair = sorted({first_rank_of(r), last_rank_of(r)})
            group = dist.new_group(pair) if len(pair) == 2 else None
            if r == replica:
                self.group = group

    def sync(self) -> dict[str, float]:
        """Sum the two copies' gradients (after the data-parallel sync, before the
        optimizer step); ``{"bytes": wire bytes this rank sent, "time_s": ...}``."""
        if not self.tables:
            return {"bytes": 0, "time_s": 0.0}
        t0 = time.perf_counter()
        grads = [p.grad for p in self.tables]
        if any(g is None for g in grads):
            raise RuntimeError("tied embedding: a copy has no gradient after the backward pass")
        sent = 0
        if len(grads) == 2:  # both copies here: the sum is local
            grads[0].add_(grads[1])
            grads[1].copy_(grads[0])
        else:
            dist.all_reduce(grads[0], group=self.group)
            sent = collective_cost("allreduce", grads[0].numel() * grads[0].element_size(), 2)[0]
        return {"bytes": int(sent), "time_s": time.perf_counter() - t0}
