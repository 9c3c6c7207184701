"""The 1-bit optimizers' two variance options (:mod:`perfsim.runtime.onebit_optim`).

The compression stage of 1-bit Adam / 1-bit LAMB preconditions with a variance frozen at
the end of warm-up. It does not bound the step of a coordinate whose gradient outgrows
it: weights of rare, large inputs whose warm-up variance was ~1e-8 take steps
``m_hat / sqrt(v_frozen)`` in the hundreds to thousands, where Adam's own never exceed
``(1 - b1) / sqrt(1 - b2)`` = 3.16 (Kingma & Ba, "Adam: A Method for Stochastic
Optimization", arXiv:1412.6980, Sec. 2.1), and the run diverges even with exact
averaging (``scripts/onebit_frozen_variance.py``; docs/ddp.md). Both options are off by
default (the papers' algorithms); spec ``onebit-adam:refresh=16:bound=adam``:

* ``refresh=K``: 0/1 Adam's variance schedule (Lu et al., "Maximizing Communication
  Efficiency for Large-scale Training via 0/1 Adam", arXiv:2202.06009; the steps in
  :mod:`perfsim.compression.refresh`). On those steps the gradients are averaged
  uncompressed (a warm-up step's bytes, which ``perfsim predict`` charges) and the
  preconditioning variance is updated with them (1-bit LAMB: the frozen one); the
  compressor's error buffers, in units of the old denominator in the preconditioned
  exchange, are converted to the new one.
* ``bound=adam``: after the exchange, a coordinate whose step ``m_hat / denom`` exceeds
  Adam's bound gets the variance at which it meets it (what Adam's ``v`` is after a first
  gradient on a coordinate that had none) and keeps it. No bytes; ``m`` and ``denom`` are
  identical on every rank, so the replicas stay bit-identical.
"""

from __future__ import annotations

import torch

from perfsim.compression.refresh import step_bound


class VarianceOptions:
    """Mixin of :class:`perfsim.runtime.onebit_optim._OneBitBase`: it provides ``_st``,
    ``variance_key`` (the preconditioning variance's state key), ``global_state``
    (``freeze_step``, ``refreshes``), ``exchange``, ``group`` and ``compressor``."""

    def _denoms(self, items) -> list[torch.Tensor]:
        """``sqrt(v / (1 - b2^n)) + eps`` of the preconditioning variance, per parameter."""
        n = self._variance_steps()
        return [(self._st(w)[self.variance_key] / (1 - g["betas"][1] ** n)).sqrt_().add_(g["eps"])
                for w, g in items]

    def _refresh(self, items, grads) -> None:
        """Update the preconditioning variance with the averaged gradients (0/1 Adam's
        ``v <- b2 v + (1 - b2) g^2`` at a step of ``T_v``, arXiv:2202.06009 Alg. 1). With
        the preconditioned exchange the compressor's error buffers hold momentum divided
        by the old denominator: they are converted to the new one, so the pending
        compensation still means the same momentum (else a coordinate whose variance
        grew by 1e6 would release its backlog a thousand times over)."""
        old = self._denoms(items) if self.exchange == "preconditioned" else None
        for (w, g), grad in zip(items, grads):
            self._st(w)[self.variance_key].mul_(g["betas"][1]).addcmul_(grad, grad, value=1 - g["betas"][1])
        self.global_state["refreshes"] += 1
        from perfsim.runtime.onebit_optim import _world  # lazy: a cycle (onebit_optim imports this module)

        world = _world(self.group)
        if old is not None and world > 1 and hasattr(self.compressor, "rescale_errors"):
            import torch.distributed as dist  # lazy: torch is heavy, needed only here

            factor = torch.cat([(o / n).reshape(-1) for o, n in zip(old, self._denoms(items))])
            self.compressor.rescale_errors(factor, dist.get_rank(self.group), world)

    def _lift(self, st: dict, denom: torch.Tensor, g: dict, t: int) -> torch.Tensor:
        """``bound="adam"``: raise the preconditioning variance of every coordinate whose
        step ``m_hat / denom`` exceeds Adam's own bound (:func:`step_bound`) to the value at
        which it meets it -- Adam's ``v`` after a first gradient on a coordinate that had
        none (arXiv:1412.6980 Sec. 2.1). ``m`` and ``denom`` are identical on every rank,
        so the replicas stay identical; returns the new denominator."""
        b1, b2 = g["betas"]
        need = st["exp_avg"].abs() / ((1 - b1 ** t) * step_bound(b1, b2))
        over = need > denom
        if not bool(over.any()):
            return denom
        v = st[self.variance_key]
        n = self._variance_steps()
        v.copy_(torch.where(over, (need - g["eps"]).clamp_min(0) ** 2 * (1 - b2 ** n), v))
        return torch.maximum(denom, need)

    def _variance_steps(self) -> int:
        """How many gradients the preconditioning variance has averaged: the warm-up's
        and the refreshes' (its bias correction ``1 - b2**n``)."""
        return self.global_state["freeze_step"] + self.global_state["refreshes"]
