"""One vocabulary of compression specs, shared by the registry, the runtime,
profiles and plots.

A spec is text such as ``aqsgd:fw3bw6`` or ``qsgd-maxnorm:4``. :func:`parse_spec`
turns it into a :class:`Spec`: the registry name, the *family* (what consumes
it), the arguments, the canonical text every command prints and accepts, and a
display label. Two roles:

* ``pipeline`` (``--compress``): the pair used across a pipeline boundary,
  forward activations and backward gradients: ``fp32``, ``fp16``,
  ``directq:fw4bw8``, ``aqsgd:fw3bw6[:m8]`` (fwXbwY = forward / backward bits;
  a spec without fwXbwY uses the same compressor both ways). Family ``pipeline``.
* ``grad`` (``--grad-compress``): data-parallel gradient synchronisation:
  ``none`` (fp32 allreduce), any registered compressor (family ``compressor``),
  ``powersgd:RANK[:start=N][:min_rate=R]`` (family ``hook``: torch's PowerSGD DDP
  hook) and ``onebit-adam`` / ``onebit-lamb[:warmup=N][:exchange=...]`` (family
  ``optimizer``: the 1-bit optimizers exchange compressed momentum themselves).

A :class:`Spec` is THE value of a spec: parsed once at the edge (``perfsim.params``,
the config dataclasses, :mod:`perfsim.ddp`'s public entries), then held by the
strategy, the engine, the runtime and the planner, which read its attributes
(:attr:`Spec.family`, :attr:`Spec.plain`, :attr:`Spec.compressor`, :meth:`Spec.pipeline_pair`,
a 1-bit optimizer's :attr:`Spec.warmup` / :attr:`Spec.exchange`, PowerSGD's
:attr:`Spec.rank` ...) and never parse or compare its text again; per-boundary
overrides are a map of Specs (:class:`perfsim.boundaries.BoundarySpecs`).

This module imports no torch: it only reads text. Building a compressor from a
Spec (which checks its arguments) is :func:`perfsim.compression.make_compressor`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from functools import cached_property

from perfsim.errors import ConfigError

#: ``compressor``: one tensor compressor, as :func:`make_compressor` builds it
ROLES = ("pipeline", "grad", "compressor")
FAMILIES = ("pipeline", "compressor", "hook", "optimizer")
#: gradient specs run by a 1-bit optimizer (perfsim.runtime.onebit_optim)
OPTIMIZERS = ("onebit-adam", "onebit-lamb")
#: compressors that need per-sample keys (activations), so pipeline-only
PIPELINE_ONLY = ("aqsgd",)
#: gradient specs run by a torch DDP communication hook
HOOKS = ("powersgd",)
#: what a 1-bit optimizer's compression stage exchanges (``onebit-adam:exchange=...``;
#: perfsim.runtime.onebit_optim explains both)
EXCHANGES = ("preconditioned", "momentum")
#: pipeline specs ``perfsim compressors`` lists (each accepted by predict and run)
PIPELINE_EXAMPLES = ("fp32", "fp16", "bf16", "directq:fw4bw8", "aqsgd:fw3bw6", "aqsgd:fw2bw4:m8",
                     "topk:0.2:8")
#: display names by registry name
DISPLAY = {
    "fp32": "FP32", "none": "none", "fp16": "FP16", "bf16": "BF16", "directq": "DirectQ",
    "aqsgd": "AQ-SGD", "qsgd": "QSGD", "qsgd-maxnorm": "QSGD-MaxNorm",
    "qsgd-maxnorm-multiscale": "QSGD-MaxNorm multiscale", "maxnorm": "MaxNorm",
    "randk-maxnorm": "RandK-MaxNorm", "randk-maxnorm-multiscale": "RandK-MaxNorm multiscale",
    "ecq": "ECQ-SGD", "onebit": "1-bit", "onebit-adam": "1-bit Adam",
    "onebit-lamb": "1-bit LAMB", "powersgd": "PowerSGD", "topk": "Top-k", "randk": "Rand-k",
}
#: the plain casts: no codec beyond a dtype change (``none``: the fp32 allreduce)
CASTS = ("none", "fp32", "fp16", "bf16")
_ALIASES = {"pipeline": {"none": "fp32"}, "grad": {"fp32": "none"}, "compressor": {"none": "fp32"}}
_FWBW = re.compile(r"fw(\d+)bw(\d+)")


@dataclass(frozen=True)
class Spec:
    """A parsed compression spec (see the module docstring): one value for every layer."""

    #: registry name (``aqsgd``, ``qsgd-maxnorm``, ``powersgd``, ``onebit-adam``, ``none``)
    name: str
    #: ``pipeline`` | ``compressor`` | ``hook`` | ``optimizer``: what consumes it
    family: str
    #: the arguments after the name, canonical (``("fw3bw6", "m8")``)
    args: tuple[str, ...]
    #: ``pipeline``, ``grad`` or ``compressor``
    role: str
    #: a 1-bit optimizer's warm-up steps (``onebit-adam:warmup=N``; None: not given),
    #: checked by the parser (:func:`check_warmup`); derived from ``args``
    warmup: int | None = field(default=None, compare=False, repr=False)
    #: what a 1-bit optimizer exchanges (:data:`EXCHANGES`; None: not given); from ``args``
    exchange: str | None = field(default=None, compare=False, repr=False)
    #: 0/1 Adam's variance refreshes per doubling of their spacing
    #: (:mod:`perfsim.compression.refresh`; None: not given, 0); from ``args``
    refresh: int | None = field(default=None, compare=False, repr=False)
    #: ``adam`` clips the compression stage's step to Adam's own bound (None: off); from ``args``
    bound: str | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.warmup is not None:  # the one rule, whoever builds the value
            check_warmup(self.warmup, f"grad compression {self.text!r}")

    @property
    def text(self) -> str:
        """The canonical spec text: what every command prints and accepts."""
        return ":".join((self.name, *self.args))

    @property
    def label(self) -> str:
        """Display label: ``aqsgd:fw3bw6`` -> ``AQ-SGD fw3 bw6``, ``qsgd-maxnorm:4`` ->
        ``QSGD-MaxNorm 4-bit``, ``powersgd:2`` -> ``PowerSGD r=2``."""
        words = [DISPLAY.get(self.name, self.name)]
        for a in self.args:
            m = _FWBW.fullmatch(a)
            if m:
                words.append(f"fw{m.group(1)} bw{m.group(2)}")
            elif a.isdigit():
                words.append(f"r={a}" if self.name == "powersgd" else f"{a}-bit")
            else:
                words.append(a)
        return " ".join(words)

    @property
    def plain(self) -> bool:
        """No compression: the fp32 pipeline (``fp32``) or the fp32 allreduce (``none``);
        under 16-bit training these send the training dtype itself."""
        return self.name in ("none", "fp32") and not self.args

    @property
    def cast(self) -> bool:
        """A plain dtype cast (:data:`CASTS`): no codec state, nothing to keep per bucket."""
        return self.name in CASTS and not self.args

    @property
    def optimizer(self) -> str:
        """The 1-bit optimizer of family ``optimizer`` (``onebit-adam``), else ``""``."""
        return self.name if self.family == "optimizer" else ""

    @property
    def compressor(self) -> "Spec":
        """The tensor compressor that carries a gradient spec's data-parallel traffic
        (role ``compressor``): ``none`` -> ``fp32``; a 1-bit optimizer's compressed stage
        -> ``onebit`` (its momentum exchange, :mod:`perfsim.runtime.onebit_optim`); a
        PowerSGD hook -> the ``powersgd`` compressor of the same arguments."""
        if self.role == "compressor":
            return self
        if self.role != "grad":
            raise ConfigError(f"{self.text!r}: a pipeline spec has a compressor per direction "
                              f"(pipeline_pair)")
        if self.family == "optimizer":
            return Spec("onebit", "compressor", (), "compressor")
        return Spec("fp32" if self.name == "none" else self.name, "compressor", self.args, "compressor")

    def pipeline_pair(self) -> tuple["Spec", "Spec"]:
        """(forward, backward) compressor specs of a pipeline spec: ``directq:fw4bw8`` ->
        (``directq:4``, ``directq:8``); ``aqsgd:fw3bw6:m8`` -> (``aqsgd:3:m8``,
        ``directq:6``): AQ-SGD compresses the forward activations by their change,
        the backward gradients are directly quantized (AQ-SGD, arXiv:2206.01299, Sec. 3
        and App. H.5)."""
        if self.role != "pipeline":
            raise ConfigError(f"{self.text!r}: not a pipeline compression spec")
        fwbw = [a for a in self.args if _FWBW.fullmatch(a)]
        rest = tuple(a for a in self.args if not _FWBW.fullmatch(a))
        if not fwbw:
            same = Spec(self.name, "compressor", self.args, "compressor")
            return same, same
        fw_bits, bw_bits = _FWBW.fullmatch(fwbw[0]).groups()
        fw = Spec(self.name, "compressor", (fw_bits, *rest), "compressor")
        bw = Spec("directq", "compressor", (bw_bits,), "compressor") if self.name == "aqsgd" else \
            Spec(self.name, "compressor", (bw_bits, *rest), "compressor")
        return fw, bw

    # -- PowerSGD (family ``hook``): the values of torch's hook, from the compressor's own grammar
    @cached_property
    def _powersgd(self) -> tuple[int, int, float]:
        if self.family != "hook":
            raise ConfigError(f"{self.text!r}: not a PowerSGD spec")
        # lazy: a cycle (perfsim.compression imports this module); loads every compressor
        from perfsim.compression import make_compressor

        ps = make_compressor(self)  # its arguments checked; ConfigError naming the spec
        return ps.rank, ps.start, ps.min_rate

    @property
    def rank(self) -> int:
        """PowerSGD's matrix approximation rank."""
        return self._powersgd[0]

    @property
    def start_iter(self) -> int:
        """PowerSGD's vanilla-allreduce iterations before compressing (torch: >= 2 with
        error feedback)."""
        return self._powersgd[1]

    @property
    def min_rate(self) -> float:
        """PowerSGD compresses a tensor only above this rate (torch's ``min_compression_rate``)."""
        return self._powersgd[2]

    def warmup_steps(self, total_steps: int | None = None) -> int | None:
        """The warm-up a 1-bit optimizer spec gets when no ``warmup=`` argument is
        passed -- its ``:warmup=N``, else :data:`WARMUP_FRACTION` of ``total_steps``
        (at least 1), else :data:`DEFAULT_WARMUP` -- or None for a gradient compressor
        (torch-free: the simulator asks it too)."""
        if self.family != "optimizer":
            return None
        if self.warmup is not None:
            return self.warmup
        if total_steps is not None:
            if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
                raise ConfigError(f"total_steps={total_steps!r}: must be an integer >= 1")
            return max(1, round(WARMUP_FRACTION * total_steps))
        return DEFAULT_WARMUP

    def __str__(self) -> str:
        return self.text


#: warm-up steps when neither the spec (``onebit-adam:warmup=N``) nor the caller
#: gives one. A fixed number of steps, not a fraction of the run: the papers warm
#: up for 15-20 % of training (1-bit LAMB, arXiv:2104.06069, Sec. 3.3 and 6.1), so set it
#: to that share of *your* run; resuming with another value is allowed before the
#: variance froze (see :meth:`perfsim.runtime.onebit_optim._OneBitBase.load_state_dict`).
DEFAULT_WARMUP = 100
#: share of the run spent in warm-up when the run's length is known (``total_steps``):
#: the top of the papers' 15-20 % (1-bit Adam: 4000 of 28125 and 475 of 3125 BERT steps;
#: 1-bit LAMB: 1000 of 5993 and 107 of 555 -- arXiv:2104.06069 Sec. 3.1 and 6.1)
WARMUP_FRACTION = 0.2


def parse_spec(text: "str | Spec", role: str = "grad") -> Spec:
    """Parse ``text`` in ``role`` (``pipeline`` or ``grad``) into a :class:`Spec`.

    Checks the grammar only (name, fwXbwY placement); the compressor's own
    arguments are checked when it is built. Raises ConfigError naming the spec.
    """
    if isinstance(text, Spec):
        if text.role == role:
            return text  # a value is never parsed again
        text = text.text  # another role reads the same text (``none`` is ``fp32`` there)
    return _parse(text, role)


def _parse(text: str, role: str) -> Spec:
    """The grammar: text -> :class:`Spec` (the one place text is read)."""
    if role not in ROLES:
        raise ValueError(f"role={role!r}: choose from {', '.join(ROLES)}")
    what = {"pipeline": "pipeline compression", "grad": "grad compression",
            "compressor": "compressor"}[role]
    if not isinstance(text, str):
        raise ConfigError(f"{what} {text!r}: a spec is text such as 'qsgd:4', not {type(text).__name__}")
    if not text.strip():
        raise ConfigError(f"{what} {text!r}: empty")
    name, *args = [part.strip() for part in text.strip().split(":")]
    if not name or any(not a for a in args):
        raise ConfigError(f"{what} {text!r}: empty part between ':'")
    name = _ALIASES[role].get(name.lower(), name.lower())
    # names, fwXbwY and options are case-insensitive; option values (disk=PATH) are not
    args = [a.lower() if _FWBW.fullmatch(a.lower()) or "=" not in a
            else f"{a.split('=', 1)[0].lower()}={a.split('=', 1)[1]}" for a in args]
    fwbw = [a for a in args if _FWBW.fullmatch(a)]
    if role == "compressor":
        if fwbw:
            raise ConfigError(f"{what} {text!r}: fwXbwY is for pipeline compression (--compress)")
        return Spec(name, "compressor", tuple(args), role)
    if role == "grad":
        if fwbw:
            raise ConfigError(f"{what} {text!r}: fwXbwY is for pipeline compression (--compress)")
        if name in PIPELINE_ONLY:
            raise ConfigError(f"{what} {text!r}: {name} compresses pipeline activations "
                              "(--compress), not gradients")
        family = "optimizer" if name in OPTIMIZERS else "hook" if name in HOOKS else "compressor"
        spec = Spec(name, family, tuple(args), role)
        if family == "optimizer":  # the options of a 1-bit optimizer are checked here, once
            warmup, exchange, refresh, bound = optimizer_options(spec)
            spec = replace(spec, warmup=warmup, exchange=exchange, refresh=refresh, bound=bound)
        if family == "hook" and not args:
            raise ConfigError(f"{what} {text!r}: {name} needs a rank, e.g. {name}:2")
        return spec
    if len(fwbw) > 1:
        raise ConfigError(f"{what} {text!r}: more than one fwXbwY")
    if name == "aqsgd" and not fwbw:
        raise ConfigError(f"{what} {text!r}: aqsgd needs fwXbwY, e.g. aqsgd:fw3bw6")
    if name in OPTIMIZERS or name in HOOKS:
        raise ConfigError(f"{what} {text!r}: {name} is a gradient compression (--grad-compress)")
    return Spec(name, "pipeline", tuple(args), role)


def check_warmup(warmup: object, who: str) -> int:
    """The warm-up steps of a 1-bit optimizer, checked: an integer >= 1. 1-bit Adam
    (Tang et al., "1-bit Adam: Communication Efficient Large-Scale Training with Adam's
    Convergence Speed", arXiv:2102.02888, Sec. 3, Algorithm 1) runs vanilla Adam during
    the warm-up stage to estimate the variance that the compression stage then keeps
    frozen as its preconditioner; with no warm-up step there is no variance estimate
    to freeze (1-bit LAMB, arXiv:2104.06069, freezes its ratios the same way).
    The one rule for predict, sweep, run and :mod:`perfsim.ddp`: the spec parser, the
    runtime's spec and the optimizer's constructor all call it. ``who`` prefixes the
    error (the spec or the optimizer)."""
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
        raise ConfigError(f"{who}: warmup={warmup!r} must be an integer >= 1 (1-bit Adam, "
                          f"arXiv:2102.02888: the warm-up steps estimate the variance that the "
                          f"compression stage freezes; 0 steps estimate none)")
    return warmup


def optimizer_options(spec: Spec) -> tuple[int | None, str | None, int | None, str | None]:
    """``(warmup, exchange, refresh, bound)`` of a 1-bit optimizer spec being parsed
    (``onebit-adam[:warmup=N][:exchange=preconditioned|momentum][:refresh=K][:bound=off|adam]``;
    None where not given), each checked (:func:`check_warmup`, :data:`EXCHANGES`,
    :mod:`perfsim.compression.refresh`): the parser stores them on the :class:`Spec`
    (:attr:`Spec.warmup`, :attr:`Spec.exchange`, :attr:`Spec.refresh`, :attr:`Spec.bound`)."""
    # lazy: import perfsim does not load perfsim.compression.refresh
    from perfsim.compression.refresh import BOUNDS, check_refresh

    who = f"grad compression {spec.text!r}"
    integers = {"warmup": check_warmup, "refresh": check_refresh}  # key -> its one check
    choices = {"exchange": EXCHANGES, "bound": BOUNDS}
    got: dict = {}
    for arg in spec.args:
        if "=" not in arg:
            raise ConfigError(f"{who}: expected key=value, got {arg!r} (e.g. {spec.name}:warmup=100)")
        key, value = arg.split("=", 1)
        if key in integers:
            try:
                number = int(value)
            except ValueError:
                raise ConfigError(f"{who}: {key}={value!r} is not an integer") from None
            got[key] = integers[key](number, who)
        elif key in choices:
            if value not in choices[key]:
                raise ConfigError(f"{who}: {key}={value!r} (choose {' or '.join(choices[key])})")
            got[key] = value
        else:
            raise ConfigError(f"{who}: unknown option {key!r} (known: warmup, exchange, refresh, bound)")
    warmup, exchange, refresh, bound = (got.get(k) for k in ("warmup", "exchange", "refresh", "bound"))
    return warmup, exchange, refresh, bound


def label(text: str, role: str = "pipeline") -> str:
    """Display label of a spec; text that does not parse is shown as given."""
    try:
        return parse_spec(text, role).label
    except ConfigError:
        return str(text)
