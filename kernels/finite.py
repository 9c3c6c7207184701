"""The Triton encoders' finiteness check, on the device and reported later.

A quantizer refuses NaN, Inf and ``|x| > MAX_ABS`` (:func:`perfsim.kernels.quant.check_finite_scales`);
the 1-bit error-feedback encoder refuses a non-finite scale
(:func:`perfsim.kernels.signpack.ef_scale`). The torch references check on the host right away.
On a GPU that check is a host synchronisation per call (about 40 us on an H100: most of a
16 MB encode), so the Triton paths check on the device instead:

* the kernel that computes the scales also writes ``1`` into a per-device int32 *flag* when a
  scale it computed is bad (NaN, Inf or above :data:`~perfsim.kernels.quant.MAX_ABS`; for the
  1-bit encoder: a non-finite scale); the flag is sticky until it is read;
* the encoder returns at once and files ``(what, scales)`` as *pending*;
* :func:`check_deferred` reads the flag (one synchronisation for everything pending) and, if
  it is set, raises the very ``ConfigError`` the host check raises, for the first bad call.

:func:`check_deferred` runs at the next natural synchronisation: every decoder of this package
(``unpack_dequantize``, ``aqsgd_receive``, ``sign_unpack``) calls it first, a caller that
reads a payload on the host calls it (it is public: ``perfsim.kernels.check_deferred``), and
an encoder calls it when :data:`MAX_PENDING` calls are pending (so an error is never later than
that many encodes and the pending list stays small). A refused call leaves the same state as
the host check did: the AQ-SGD step does not update its buffer rows of a bad bucket, and the
1-bit encoder leaves its error buffer untouched when the scale is not finite.
"""

from __future__ import annotations

import threading

from perfsim._lazy import torch

from perfsim.errors import ConfigError

#: encodes whose check may be pending before an encoder forces :func:`check_deferred`
MAX_PENDING = 64

_STATE = threading.local()


def _state():
    st = getattr(_STATE, "v", None)
    if st is None:
        st = _STATE.v = {"flags": {}, "pending": {}}
    return st


def device_flag(device) -> torch.Tensor:
    """The sticky int32 flag of ``device`` (this thread's): 0 until a kernel reports a bad scale."""
    flags = _state()["flags"]
    f = flags.get(device)
    if f is None:
        f = flags[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return f


def flag_bad_scales(s: torch.Tensor, flag: torch.Tensor, max_abs: float) -> None:
    """Set ``flag`` on the device when a scale of ``s`` is NaN, Inf or above ``max_abs`` (for the
    paths whose scales torch reduces; the single-pass kernels set it themselves)."""
    if s.numel():
        bad = torch.logical_not(s <= max_abs).any().to(torch.int32)
        torch.maximum(flag, bad, out=flag)


def defer(device, what: str, scales: torch.Tensor, data_absmax: torch.Tensor | None = None) -> None:
    """File one encode's check: ``scales`` (a quantizer's per-bucket max-abs, or the 1-bit
    encoder's scale with ``data_absmax``, the max |x + e| per program, telling NaN/Inf data from
    a norm too large for float32) as ``what``."""
    pending = _state()["pending"].setdefault(device, [])
    pending.append((what, scales, data_absmax))
    if len(pending) >= MAX_PENDING:
        check_deferred()


def pending_count() -> int:
    """Encodes of this thread whose check is still pending."""
    return sum(len(v) for v in _state()["pending"].values())


def check_deferred() -> None:
    """Raise the ``ConfigError`` of the first pending encode whose input was refused (one
    synchronisation per device with pending checks; nothing to do when none is pending)."""
    st = _state()
    for key in list(st["pending"]):
        pending = st["pending"].pop(key)
        if not pending:
            continue
        flag = st["flags"][key]
        if not int(flag.item()):
            continue
        flag.zero_()
        for what, scales, data_absmax in pending:
            _raise_if_bad(what, scales, data_absmax)
        raise ConfigError("an encoder's input: contains NaN or Inf; refusing to compress")


def _raise_if_bad(what: str, scales: torch.Tensor, data_absmax: torch.Tensor | None) -> None:
    if data_absmax is None:
        from perfsim.kernels.quant import check_finite_scales

        check_finite_scales(scales, what)
        return
    from perfsim.kernels.signpack import ef_scale_error

    if not bool(torch.isfinite(scales).all()):
        raise ef_scale_error(not bool(torch.isfinite(data_absmax).all()), what)
