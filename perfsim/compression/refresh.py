"""When a 1-bit optimizer refreshes its frozen variance (``onebit-adam:refresh=K``), and
the step bound ``onebit-adam:bound=adam`` keeps (:func:`step_bound`).

0/1 Adam (Lu, Li, Zhang, De Sa, He, "Maximizing Communication Efficiency for
Large-scale Training via 0/1 Adam", arXiv:2202.06009, Sec. 4, Algorithm 1) does not
freeze Adam's variance once: it updates it at the steps of a set ``T_v`` whose
spacing grows exponentially ("adaptive variance freezing": the variance changes
ever more slowly, so it needs ever fewer updates), and keeps it fixed in between.
Its schedule, as DeepSpeed's ``ZeroOneAdam`` implements it (``var_update_scaler``):
``K`` updates one step apart, then ``K`` updates two steps apart, then ``K`` four
steps apart, ... -- block ``j`` holds ``K`` steps spaced ``2**j`` apart, and ends at
step ``K * (2**(j+1) - 1)``.

Here the schedule runs from step 1 like 0/1 Adam's, and the 1-bit optimizer's
warm-up (every step an uncompressed Adam step) covers its first steps: a *refresh*
is a step of ``T_v`` after the warm-up. On a refresh step the optimizer averages the
gradients uncompressed -- exactly the bytes of a warm-up step -- and takes an Adam
step that also updates the variance (:mod:`perfsim.runtime.onebit_optim`). Torch-free:
the simulator counts the same steps to price them (:func:`uncompressed_steps`).
"""

from __future__ import annotations

import math

from perfsim.errors import ConfigError

__all__ = ["BOUNDS", "DEFAULT_BOUND", "check_refresh", "step_bound", "is_refresh", "refreshes_until", "uncompressed_steps"]

#: how the compression stage bounds a coordinate's step (``onebit-adam:bound=...``):
#: ``off`` (1-bit Adam / LAMB as published) or ``adam`` (:func:`step_bound`)
BOUNDS = ("off", "adam")
DEFAULT_BOUND = "off"


def step_bound(b1: float, b2: float) -> float:
    """The largest ``|m_hat / sqrt(v_hat)|`` Adam itself can take: ``(1 - b1) / sqrt(1 - b2)``
    when ``1 - b1 > sqrt(1 - b2)`` -- reached when a coordinate's gradient was zero at every
    step but the current one -- else 1 (Kingma & Ba, "Adam: A Method for Stochastic
    Optimization", arXiv:1412.6980, Sec. 2.1). Adam's own ``v`` guarantees it; a *frozen*
    ``v`` does not (a coordinate whose warm-up variance was ~0 takes steps of
    ``m / sqrt(v_frozen)`` in the hundreds), so ``bound=adam`` raises the preconditioning
    variance of such a coordinate to the value at which its step meets the bound -- what
    Adam's ``v`` does on a first gradient -- and keeps it (perfsim.runtime.onebit_optim).
    3.16 for the default betas (0.9, 0.999)."""
    ratio = (1 - b1) / math.sqrt(1 - b2) if b2 < 1 else math.inf
    return ratio if ratio > 1 else 1.0


def check_refresh(refresh: object, who: str) -> int:
    """``refresh`` checked: an integer >= 0 (0: the variance stays frozen, 1-bit Adam /
    1-bit LAMB as published). ``who`` prefixes the error."""
    if isinstance(refresh, bool) or not isinstance(refresh, int) or refresh < 0:
        raise ConfigError(f"{who}: refresh={refresh!r} must be an integer >= 0 (0/1 Adam's variance "
                          "updates per doubling of their spacing, arXiv:2202.06009; 0: frozen variance)")
    return refresh


def _block(step: int, refresh: int) -> tuple[int, int]:
    """``(j, start)``: the block of the schedule holding ``step`` (>= 1) and the step
    before that block's first update."""
    j, start = 0, 0
    while step > start + refresh * 2 ** j:
        start += refresh * 2 ** j
        j += 1
    return j, start


def is_refresh(step: int, warmup: int, refresh: int) -> bool:
    """True when 1-based ``step`` (after a warm-up of ``warmup`` steps) updates the
    variance: it is in 0/1 Adam's ``T_v`` with ``K = refresh`` (module docstring)."""
    if refresh <= 0 or step <= warmup:
        return False
    j, start = _block(step, refresh)
    return (step - start) % 2 ** j == 0


def refreshes_until(step: int, warmup: int, refresh: int) -> int:
    """How many refresh steps lie in ``warmup + 1 .. step``."""
    if refresh <= 0 or step <= warmup:
        return 0

    def upto(n: int) -> int:  # |T_v ∩ [1, n]|
        if n <= 0:
            return 0
        j, start = _block(n, refresh)
        return refresh * j + (n - start) // 2 ** j

    return upto(step) - upto(warmup)


def uncompressed_steps(total: int, warmup: int, refresh: int) -> int:
    """Steps of a ``total``-step run that average gradients uncompressed: the warm-up
    and the refreshes after it (the simulator prices these at the warm-up's bytes)."""
    return min(total, warmup) + refreshes_until(total, warmup, refresh)
