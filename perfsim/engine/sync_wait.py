"""Synchronisation wait: a collective starts when the LAST of its ranks arrives.

Ranks do not finish their compute together. Two sources, both relative to one GPU's
compute time ``C`` per iteration (its forward and backward passes and tensor-parallel
collectives, the critical device's):

* static spread ``cv_static``: GPUs of one SKU run at different speeds (power management,
  manufacturing): Sinha et al., "Not All GPUs Are Created Equal: Characterizing
  Variability in Large-Scale, Accelerator-Rich Systems", SC22, arXiv:2208.11035, measured
  8 % average performance variation (max 22 %) over the GPUs of five clusters, outliers
  1.5x slower than the median. It does not average out: the slowest GPU is slow every
  micro-batch;
* dynamic jitter ``cv_dynamic`` of one micro-batch's compute (host scheduling, clocks,
  memory refresh, OS noise: Hoefler, Schneider and Lumsdaine, "Characterizing the Influence
  of System Noise on Large-Scale Applications by Simulation", SC10): independent between
  micro-batches, so over the ``m`` micro-batches accumulated before the gradient sync its
  relative spread is ``cv_dynamic / sqrt(m)``.

Every GPU of the job is coupled once per iteration (the data-parallel collective, the
pipeline's messages and flush, tensor parallelism's per-layer collectives), so the
iteration ends after the slowest of its ``N = tp x pp x dp`` GPUs. With Gaussian times of
spread ``sigma = C sqrt(cv_static^2 + cv_dynamic^2 / m)`` the expected wait beyond the
mean is ``sigma E[Z_(N)]``, ``E[Z_(N)]`` the expected maximum of ``N`` standard normals:
Blom's approximation ``Phi^-1((N - 0.375) / (N + 0.25))`` (Blom, "Statistical Estimates
and Transformed Beta-Variables", 1958; David and Nagaraja, "Order Statistics", 3rd ed.,
2003, Sec. 4.5), which grows as ``sqrt(2 ln N)`` (Gumbel). It grows with the rank count
and shrinks with gradient accumulation. Not modelled: the wait at every tensor-parallel
collective inside a layer (per-kernel jitter between lockstep ranks, Hoefler's noise
amplification), heavy-tailed stragglers.

Switch: ``--straggler-cv`` and ``--jitter-cv`` (``System.straggler_cv``,
``System.jitter_cv``); both default 0 (off): perfsim's validation data are single-node or
two CPU ranks and cannot tell a spread from other errors (docs/model.md).
"""

from __future__ import annotations

import math
from statistics import NormalDist


def expected_max_normal(n: int) -> float:
    """E[max of ``n`` independent standard normals], Blom's approximation (module docstring);
    0 for one rank."""
    if n <= 1:
        return 0.0
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def sync_wait_s(compute_s: float, ranks: int, microbatches: int, cv_static: float, cv_dynamic: float) -> float:
    """Expected seconds per iteration the slowest of ``ranks`` GPUs adds (module docstring)."""
    if compute_s <= 0 or ranks <= 1 or (cv_static <= 0 and cv_dynamic <= 0):
        return 0.0
    sigma = compute_s * math.sqrt(cv_static ** 2 + cv_dynamic ** 2 / max(1, microbatches))
    return sigma * expected_max_normal(ranks)
