"""A data-parallel gradient compression spec (``--grad-compress``) as a value.

Parsed once from the one grammar of :mod:`perfsim.compression.spec` into a
:class:`GradSpec`, which the simulator (``perfsim.engine.plan``), the runtime
(:mod:`perfsim.runtime.grad_sync`) and :mod:`perfsim.ddp` all hold. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfsim.compression.spec import OPTIMIZERS as ONEBIT_OPTIMIZERS
from perfsim.compression.spec import check_warmup, optimizer_options
from perfsim.errors import ConfigError

__all__ = ["DEFAULT_WARMUP", "ONEBIT_OPTIMIZERS", "WARMUP_FRACTION", "GradSpec", "parse_grad_spec", "warmup_steps"]


@dataclass(frozen=True)
class GradSpec:
    """A parsed ``--grad-compress`` spec.

    kind: ``compressor`` (a compression-library compressor averages each bucket),
      ``powersgd`` (torch's PowerSGD hook) or ``optimizer`` (a 1-bit optimizer
      exchanges momentum; gradients are not synchronised here).
    text: the spec as given (canonical lower case).
    compressor: compressor spec for ``kind == "compressor"`` (``fp32`` for none).
    rank: PowerSGD matrix approximation rank.
    start_iter: PowerSGD's vanilla-allreduce iterations before compressing
      (torch requires >= 2 with error feedback).
    min_rate: PowerSGD compresses a tensor only above this compression rate
      (torch's ``min_compression_rate``).
    optimizer: ``onebit-adam`` / ``onebit-lamb`` for ``kind == "optimizer"``.
    warmup: 1-bit optimizer warm-up steps (None: the optimizer's default).
    exchange: what the 1-bit optimizer compresses: ``preconditioned`` (momentum
      divided by the frozen Adam denominator) or ``momentum`` (the papers' exact
      choice); None: the optimizer's default. See :mod:`perfsim.runtime.onebit_optim`.
    refresh: 0/1 Adam's variance refreshes per doubling of their spacing
      (:mod:`perfsim.compression.refresh`; None: 0, frozen).
    bound: ``adam`` clips the compression stage's step to Adam's own bound (None: off).
    """

    kind: str
    text: str
    compressor: str = ""
    rank: int = 0
    start_iter: int = 2
    min_rate: float = 2.0
    optimizer: str = ""
    warmup: int | None = None
    exchange: str | None = None
    refresh: int | None = None
    bound: str | None = None

    def __post_init__(self):
        if self.kind not in ("compressor", "powersgd", "optimizer"):
            raise ValueError(f"GradSpec.kind={self.kind!r}: not compressor/powersgd/optimizer")
        if self.kind == "powersgd" and (self.rank < 1 or self.start_iter < 2):
            raise ConfigError(f"grad compression {self.text!r}: rank must be >= 1 and start >= 2")
        if self.warmup is not None:  # the one rule of perfsim.compression.spec
            check_warmup(self.warmup, f"grad compression {self.text!r}")


#: warm-up steps when neither the spec (``onebit-adam:warmup=N``) nor the caller
#: gives one. A fixed number of steps, not a fraction of the run: the papers warm
#: up for 15-20 % of training (1-bit LAMB, arXiv:2104.06069, Sec. 3.3 and 6.1), so set it
#: to that share of *your* run; resuming with another value is allowed before the
#: variance froze (see :meth:`_OneBitBase.load_state_dict`).
DEFAULT_WARMUP = 100
#: share of the run spent in warm-up when the run's length is known (``total_steps``):
#: the top of the papers' 15-20 % (1-bit Adam: 4000 of 28125 and 475 of 3125 BERT steps;
#: 1-bit LAMB: 1000 of 5993 and 107 of 555 -- arXiv:2104.06069 Sec. 3.1 and 6.1)
WARMUP_FRACTION = 0.2


def warmup_steps(spec, total_steps: int | None = None) -> int | None:
    """The warm-up a 1-bit optimizer spec gets when no ``warmup=`` argument is
    passed -- its ``:warmup=N``, else :data:`WARMUP_FRACTION` of ``total_steps``
    (at least 1), else :data:`DEFAULT_WARMUP` -- or None for a gradient compressor
    (torch-free: the simulator asks it too)."""
    gspec = parse_grad_spec(spec)
    if gspec.kind != "optimizer":
        return None
    if gspec.warmup is not None:
        return gspec.warmup
    if total_steps is not None:
        if not isinstance(total_steps, int) or total_steps < 1:
            raise ConfigError(f"total_steps={total_steps!r}: must be an integer >= 1")
        return max(1, round(WARMUP_FRACTION * total_steps))
    return DEFAULT_WARMUP


def parse_grad_spec(spec: str) -> GradSpec:
    """Parse a data-parallel gradient compression spec (see the module docstring).

    Compressor specs are validated by building one compressor, so a bad bit
    width fails here, naming the spec.
    """
    if isinstance(spec, GradSpec):
        return spec
    from perfsim.compression import make_compressor
    from perfsim.compression.spec import parse_spec

    parsed = parse_spec(spec, "grad")  # the one grammar predict uses too
    text, name, args = parsed.text, parsed.name, parsed.args
    if parsed.family == "optimizer":
        warmup, exchange, refresh, bound = optimizer_options(parsed)  # checked once, in perfsim.compression.spec
        return GradSpec("optimizer", text, optimizer=name, warmup=warmup, exchange=exchange,
                        refresh=refresh, bound=bound)
    if parsed.family == "hook":  # torch's PowerSGD hook, with the compressor's own grammar
        if not args:
            raise ConfigError(f"grad compression {spec!r}: powersgd needs a rank, e.g. powersgd:2")
        ps = make_compressor(text)  # ConfigError naming the spec
        return GradSpec("powersgd", text, rank=ps.rank, start_iter=ps.start, min_rate=ps.min_rate)
    make_compressor(parsed)  # validates; raises ConfigError naming the spec
    return GradSpec("compressor", text, compressor="fp32" if name == "none" else text)


