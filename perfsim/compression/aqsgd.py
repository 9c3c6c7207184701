"""``aqsgd`` -- AQ-SGD activation compression (Wang et al., "Fine-tuning Language
Models over Slow Networks using Activation Compression with Guarantees",
arXiv:2206.01299, Alg. 1, App. D Alg. 2).

Instead of quantizing an activation ``a(xi)`` directly, AQ-SGD quantizes its
*change* since the sample ``xi`` was last seen. Both ends of a pipeline
boundary keep a buffer ``m(xi)`` per training sample:

* first visit of ``xi`` (Alg. 1 lines 4-5): send ``a`` in full precision
  (float32), both ends set ``m(xi) = a``;
* later visits (lines 7-9): send ``Q(a - m(xi))``, both ends set
  ``m(xi) <- m(xi) + Q(a - m(xi))`` and the receiver uses ``m(xi)`` as its input.

``Q`` is DirectQ's quantizer (bucket = one row of the last dimension, stochastic
rounding; :mod:`perfsim.kernels.quant`), and the sender's delta / quantize /
pack / buffer update is the fused kernel :mod:`perfsim.kernels.aqsgd_step`.
Sender and receiver compute the buffer update from the same codes and scales
with the same float32 expression, so they stay bit-identical.

Spec: ``aqsgd:BITS[:m8|m4|m2][:disk=PATH]``

* ``BITS`` in 2, 3, 4, 6, 8 (forward activations; the pipeline spec
  ``aqsgd:fw3bw6`` pairs it with ``directq:6`` for the backward gradients).
* ``mZ``: keep ``m`` itself quantized with ``Z`` bits (App. H.5, "Number of
  Bits for Previous Messages"); default float32.
* ``disk=PATH``: memory-map the buffers under directory ``PATH`` instead of RAM
  (one folder ``PATH/aqsgd-<tag>-<pid>-<n>/`` per buffer; ``perfsim run`` removes
  them when the run completes, a failed or interrupted run keeps them for ``--resume``).

``compress(x, key=ids)``: ``ids`` is a 1-D integer tensor with one sample id
per row of dim 0 of ``x`` (ids unique within a batch). A batch may mix new and
seen samples. Payload tensors: ``full`` (float32 rows of the new samples, in
batch order), ``codes`` and ``scales`` (the quantized deltas of the seen
samples, in batch order). ``wire_bytes(shape)`` is the steady state (every
sample seen), ``wire_bytes(shape, warmup=True)`` the first epoch (float32), and
:meth:`AQSGD.payload_bytes` any mix. State (``state_dict``): the seen ids and
their slots, the buffers (RAM) or their files (disk), the step counter.
"""

from __future__ import annotations

import math
from typing import Sequence

from perfsim._lazy import torch

from perfsim.compression.aqsgd_store import MessageStore
from perfsim.compression.args import SpecArg
from perfsim.compression.base import Compressor, Payload, check_float, numel_of, passes
from perfsim.compression.directq import check_payload_tensors
from perfsim.compression.registry import register
from perfsim.errors import ConfigError
from perfsim.kernels.aqsgd_step import aqsgd_receive, aqsgd_step
from perfsim.kernels.packing import packed_nbytes
from perfsim.kernels.quant import QUANT_BITS, check_finite_scales
from perfsim.kernels.rng import call_key

MBITS = (2, 4, 8)
#: hash streams: the message, new-sample buffer writes, seen-sample buffer writes
_STREAM_MSG, _STREAM_NEW, _STREAM_SEEN = 0, 1, 2


@register
class AQSGD(Compressor):
    """AQ-SGD: quantize the change of each sample's activation since its last visit."""

    name = "aqsgd"
    example_spec = "aqsgd:3"
    allreduce_compatible = False
    stateful = True

    spec_args = (
        SpecArg("bits", choices=QUANT_BITS),
        SpecArg("mbits", default=None, words={f"m{b}": b for b in sorted(MBITS, reverse=True)}),
        SpecArg("disk", str, default=None, key=True, metavar="PATH"),
    )

    def __init__(self, bits: int, *, mbits: int | None, disk: str | None, seed: int = 0, tag: str = ""):
        self.bits, self.mbits, self.disk = int(bits), mbits, disk
        self.seed, self.tag = int(seed), tag
        self.step = 0
        self.slots: dict[int, int] = {}
        self.sample_shape: tuple[int, ...] | None = None
        self.store: MessageStore | None = None
        self.spec = self.canonical_spec()

    # ------------------------------------------------------------- sizes
    @staticmethod
    def _split(shape: Sequence[int]) -> tuple[int, int, int]:
        """(batch rows, elements per sample, row length of a bucket)."""
        shape = tuple(int(d) for d in shape)
        if not shape:
            raise ConfigError("aqsgd: a tensor needs a batch dimension (one sample per row of dim 0)")
        numel_of(shape)
        per = math.prod(shape[1:])
        row = shape[-1] if len(shape) >= 2 and shape[-1] > 0 else 1
        return shape[0], per, row

    def payload_bytes(self, shape: Sequence[int], new_rows: int) -> int:
        """Exact bytes of a batch with ``new_rows`` first-visit samples."""
        b, per, row = self._split(shape)
        if not 0 <= new_rows <= b:
            raise ConfigError(f"aqsgd: new_rows={new_rows} outside [0, {b}]")
        seen = (b - new_rows) * per
        return 4 * new_rows * per + packed_nbytes(seen, self.bits) + 4 * (seen // row)

    def wire_bytes(self, shape: Sequence[int], *, warmup: bool = False) -> int:
        b, _, _ = self._split(shape)
        return self.payload_bytes(shape, b if warmup else 0)

    def payload_nbytes(self, shape: Sequence[int], *, key=None) -> int:
        """Bytes of the next call for these sample ids: rows this instance has not
        stored yet travel in full (sender and receiver keep the same ids stored)."""
        if key is None:
            return self.wire_bytes(shape)
        new = sum(1 for i in torch.as_tensor(key).tolist() if int(i) not in self.slots)
        return self.payload_bytes(shape, new)

    def codec_traffic(self, shape: Sequence[int]):
        """Steady state (every sample seen; Wang et al., arXiv:2206.01299, Alg. 1 lines
        7-9): the sender's fused step (:func:`perfsim.kernels.aqsgd_step.aqsgd_step`)
        reads ``a`` and ``m``, writes ``m`` and the payload (12 bytes a value + the
        payload); the receiver's update (``aqsgd_receive``) reads the payload and ``m``
        and writes ``m``, then copies ``m`` into its output (8 bytes a value). A quantized
        ``m`` (``mZ``, App. H.5) is decoded before and encoded after each side's step."""
        n, wire = numel_of(shape), self.wire_bytes(shape)
        store = ()
        if self.mbits is not None:
            _, _, row = self._split(shape)
            held = packed_nbytes(n, self.mbits) + 4 * (n // row)
            store = (held + 4 * n, 4 * n + held)  # decode m, re-encode it
        return (passes(*store[:1], 12 * n + wire, *store[1:]),
                passes(*store[:1], wire + 8 * n, *store[1:], 8 * n))

    # ------------------------------------------------------------- helpers
    def _ids(self, x: torch.Tensor, key) -> list[int]:
        if key is None:
            raise ConfigError("aqsgd: compress/decompress need key= (1-D tensor of sample ids, one per row)")
        key = torch.as_tensor(key)
        if key.dim() != 1 or key.is_floating_point() or key.is_complex():
            raise ConfigError(f"aqsgd: key must be a 1-D integer tensor of sample ids, got {key.dtype} "
                              f"{tuple(key.shape)}")
        ids = [int(i) for i in key.tolist()]
        if len(ids) != x.shape[0]:
            raise ConfigError(f"aqsgd: {len(ids)} sample ids for a batch of {x.shape[0]} rows")
        if len(set(ids)) != len(ids):
            raise ConfigError("aqsgd: duplicate sample ids in one batch")
        return ids

    def _ensure_store(self, shape: tuple[int, ...], device) -> None:
        sample = tuple(shape[1:])
        if self.store is None:
            _, per, row = self._split(shape)
            self.sample_shape = sample
            self.store = MessageStore(per, row, mbits=self.mbits, disk=self.disk, device=device,
                                      tag=self.tag)
        elif sample != self.sample_shape:
            raise ConfigError(f"aqsgd: sample shape {sample} differs from the buffer's {self.sample_shape}")

    def _partition(self, ids: list[int]):
        seen = [r for r, i in enumerate(ids) if i in self.slots]
        new = [r for r, i in enumerate(ids) if i not in self.slots]
        return seen, new

    def _keys(self):
        """Hash keys of this step (the caller advances ``step`` on success)."""
        st = self.step
        mk = lambda s: call_key(self.seed, st, s)  # noqa: E731
        return mk(_STREAM_MSG), mk(_STREAM_NEW), mk(_STREAM_SEEN)

    def _store_new(self, ids, new, values: torch.Tensor, key) -> None:
        slots = self.store.allocate(len(new))
        for r, s in zip(new, slots):
            self.slots[ids[r]] = s
        self.store.put(slots, values, key)

    # ------------------------------------------------------------- data path
    def compress(self, x: torch.Tensor, *, key=None) -> Payload:
        check_float(x)  # NaN/Inf: new rows below, seen rows on the delta scales
        if x.dim() == 0:
            raise ConfigError("aqsgd: a tensor needs a batch dimension")
        ids = self._ids(x, key)
        shape = tuple(x.shape)
        self._ensure_store(shape, x.device)
        per = self.store.numel
        seen, new = self._partition(ids)
        kmsg, knew, kseen = self._keys()
        xf = x.detach().reshape(len(ids), per)
        xf = xf if xf.dtype == torch.float32 else xf.float()
        full = xf[new].contiguous() if new else xf.new_zeros((0, per))
        if full.numel():
            check_finite_scales(full.abs().amax().reshape(1))
        if seen:
            sslots = [self.slots[ids[r]] for r in seen]
            m = self.store.view(sslots, x.device)  # in-place update when possible
            inplace = m is not None
            m = m if inplace else self.store.get(sslots, x.device)
            a = xf if len(seen) == len(ids) else xf[seen]
            codes, scales = aqsgd_step(a, m, self.bits, bucket=self.store.row, key=kmsg)
            if not inplace:
                self.store.put(sslots, m, kseen)
        else:
            codes = torch.zeros(0, dtype=torch.uint8, device=x.device)
            scales = torch.zeros(0, dtype=torch.float32, device=x.device)
        if new:
            self._store_new(ids, new, full, knew)
        full = full.view(len(new), *shape[1:])
        self.step += 1
        return Payload({"full": full, "codes": codes, "scales": scales}, shape, x.dtype,
                       {"new_rows": len(new), "step": self.step - 1})

    def decompress(self, payload: Payload, *, key=None) -> torch.Tensor:
        check_payload_tensors(payload, ("full", "codes", "scales"), self.spec)
        shape = tuple(payload.shape)
        full = payload.tensors["full"]
        dummy = torch.empty(shape[:1] if shape else (0,), device=full.device)
        ids = self._ids(dummy, key)
        self._ensure_store(shape, full.device)
        per = self.store.numel
        seen, new = self._partition(ids)
        if full.shape[:1] != (len(new),) or payload.meta.get("new_rows", len(new)) != len(new):
            raise ConfigError(f"aqsgd: payload carries {full.shape[0] if full.dim() else '?'} new samples, "
                              f"this receiver has {len(new)} unseen ids: sender and receiver are out "
                              f"of step")
        _, knew, kseen = self._keys()
        out = torch.empty((len(ids), per), dtype=torch.float32, device=full.device)
        if seen:
            sslots = [self.slots[ids[r]] for r in seen]
            m = self.store.view(sslots, full.device)
            inplace = m is not None
            m = m if inplace else self.store.get(sslots, full.device)
            aqsgd_receive(payload.tensors["codes"], payload.tensors["scales"], m, self.bits,
                          bucket=self.store.row)
            if not inplace:
                self.store.put(sslots, m, kseen)
            if len(seen) == len(ids):
                out.copy_(m)
            else:
                out[seen] = m
        if new:
            fv = full.reshape(len(new), per).float()
            self._store_new(ids, new, fv, knew)
            out[new] = fv
        self.step += 1
        return out.view(shape).to(payload.dtype)

    # ------------------------------------------------------------- state
    def buffer_bytes_per_sample(self) -> int:
        """Bytes of ``m`` per stored sample (0 before the first batch)."""
        return self.store.nbytes() if self.store else 0

    def release(self) -> None:
        """Remove the disk buffers (``disk=PATH``) once the run is over."""
        if self.store is not None:
            self.store.remove()

    def state_dict(self):
        return {"step": self.step, "seed": self.seed, "slots": dict(self.slots),
                "sample_shape": self.sample_shape,
                "store": self.store.state_dict() if self.store else None}

    def load_state_dict(self, state) -> None:
        unknown = set(state) - {"step", "seed", "slots", "sample_shape", "store"}
        if unknown:
            raise ConfigError(f"{self.spec}: unexpected state keys {sorted(unknown)}")
        self.step = int(state.get("step", 0))
        self.seed = int(state.get("seed", self.seed))
        self.slots = {int(k): int(v) for k, v in (state.get("slots") or {}).items()}
        sample = state.get("sample_shape")
        self.sample_shape = tuple(sample) if sample is not None else None
        st = state.get("store")
        if st is None:
            self.store = None
            return
        shape = (1, *self.sample_shape)
        _, per, row = self._split(shape)
        self.store = MessageStore(per, row, mbits=self.mbits, disk=self.disk, tag=self.tag, restore=st)
