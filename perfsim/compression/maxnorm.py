"""Allreduce-compatible quantizers on a shared max norm (S. Vineeth, "Unbiased
Single-scale and Multi-scale Quantizers for Distributed Optimization", arXiv:2109.12497).

``qsgd-maxnorm:BITS[:norm=inf|l2][:chunk=D]`` -- QSGDMaxNorm, Sec. 3.1 / Alg. 1, applied
per chunk of ``D`` values (default :func:`maxnorm_chunk`: 128 for 2 and 3 bits, 512 for 4;
``chunk=0``: one norm per tensor) with each worker's chunk norm ``||g_m||`` the max-abs
value (``norm=inf``, the default; see :data:`NORMS`) or the paper's L2 norm: the workers
agree on ``W = max_m ||g_m||`` with a max-allreduce (4 bytes per chunk), then each
quantizes its gradient on that *shared* scale, ``zeta_i = sign(v_i) * xi_i`` with
``xi_i`` the stochastic rounding of ``s |v_i| / W`` (eq. 7-8). The integer codes
of all workers live on one grid, so their sum is the code of the sum: one
sum-allreduce and one decode ``W * sum(zeta) / (s M)`` (eq. 9).

``qsgd-maxnorm-multiscale:BITS[:SCALES][:bucket=B]`` -- QSGDMaxNormMultiScale,
Sec. 3.2 / Alg. 2. ``SCALES`` is a comma list of the *other* scales' bit widths
(default ``BITS+4``, the two-scale pairs (2,6), (4,8), (6,10), (8,12) of the
paper's experiments), ``s_j = 2**(b_j - 1) - 1``. A coordinate (or a bucket of
``B`` coordinates, default 1 = per coordinate as in the paper) uses the largest
scale ``s`` with ``s * |v_i| <= W * min_j s_j`` (eq. 11), so its code still fits
in ``BITS`` bits but is finer where the gradient is small. *Scale sharing*: the
workers take the minimum scale index over workers (a min-allreduce), after
which every code of a coordinate is on the same grid and sums exactly; the
decode is ``W * sum(zeta_i) / (s*_i M)`` (eq. 13).

Lemma 1 / Lemma 2 (App. C / E): unbiased, and
``E||Q(v) - v||^2 <= (1 + min(n/s^2, sqrt(n)/s)) W^2`` with ``s = min_j s_j``.

Wire formats
------------
* ``compress`` (one worker's payload, what ``wire_bytes`` counts): ``norm``
  (fp32, one per chunk; one in all for the multi-scale variant), for the multi-scale variant ``scale_index`` (``ceil(log2 N)``
  bits per bucket, packed), and ``codes``: levels offset to ``[0, 2s]`` in
  ``BITS`` bits, densely packed (:func:`perfsim.kernels.pack_bits` (byte-exact with the reference :func:`perfsim.kernels.packing.pack_bits_ref`)).
* ``allreduce_mean`` / ``dp_plan`` (the data-parallel exchange): a packed code
  cannot be added in place, and the paper's own implementation sends int8
  tensors instead (App. A, "Limitations of the framework"). Here the offset
  codes travel in **packed integer lanes** of ``BITS + ceil(log2 M)`` bits,
  ``63 // lane`` lanes per int64 word (:mod:`perfsim.kernels.lanes`): a SUM
  allreduce of the words adds every lane without carries, exactly, in
  ``64 / lanes`` bits per value (5.33 for 4 bits over 2-3 workers).
  The norms: one fp32 per chunk of ``chunk`` values
  (:func:`perfsim.compression.qsgd.default_chunk`), max-allreduced.
  The scale indices travel as a thermometer code (``N - 1`` bits per bucket,
  bit ``j`` = "index > j"), packed, reduced with a bitwise AND -- which is the
  minimum of the indices (Alg. 2 line 7) in ``N - 1`` bits instead of a byte.
  NCCL has no bitwise reduction: there (``dp_plan(..., backend="nccl")``) the
  indices go as one uint8 per bucket with a MIN reduction, as in the paper's code.

Hot path (one worker's encode): the norm (one pass), for the multi-scale
variant ``|v|`` and one compare per extra scale against exact float32
thresholds (eq. 11), the per-element coefficient ``s*_i / W`` by table lookup,
then the counter-hash stochastic rounding of :mod:`perfsim.compression.qsgd`
(random bits from ``(seed, step, rank salt)``, identical on every device) and
the packing. All tensors may live on any device.
"""

from __future__ import annotations

from typing import Sequence

from perfsim._lazy import np
from perfsim._lazy import torch

from perfsim.compression.args import SpecArg
from perfsim.compression.base import ALLREDUCE, CommStep, Payload, check_float, numel_of, passes
from perfsim.compression.qsgd import (BITS_ARG, _SeededCompressor, check_finite_norms, chunk_for_bits,
                                      coefficients, decode_passes, flat_f32, stochastic_passes, levels_for_bits, levels_from_codes,
                                      safe_norms, scale_into, stochastic_codes_, to_dtype_saturating,
                                      unpack_codes)
from perfsim.compression.registry import register
from perfsim.errors import ConfigError, NonFiniteError
from perfsim.kernels import pack_bits, unpack_bits
from perfsim.kernels._workspace import workspace
from perfsim.kernels.lanes import lane_bits, pack_lanes, packed_words, unpack_lanes
from perfsim.kernels.packing import SUPPORTED_BITS, packed_nbytes
from perfsim.kernels.quant import bucketwise

#: widest scale of the multi-scale variants
MAX_SCALE_BITS = 24
#: the per-chunk norm ``W`` of :class:`QSGDMaxNorm`: the L2 norm of the multiscale paper, or
#: the max-abs (l_inf) norm -- QSGD's eq. (8) allows either scaling factor, and ECQ-SGD
#: (arXiv:1806.08054, Sec. 6 / Fig. 5) runs QSGD with l_inf at bucket 512
NORMS = {"l2": 2, "inf": float("inf")}


def maxnorm_chunk(values) -> int:
    """Default values per norm of ``qsgd-maxnorm`` (the default ``norm=inf``): at least
    128 -- at most 1/4 bit of float32 norm per value -- else
    :func:`perfsim.compression.qsgd.default_chunk` (512 for 4 bits).

    With the max-abs norm the rounding variance of a chunk of ``d`` values is at most
    ``sum_i |v_i| W / s <= d W^2 / (4 s^2)`` with ``W = max |v_i|``: for Gaussian-like values
    ``W^2 ~ 2 ln(d) ||v||^2 / d``, a bound of ``ln(d) / (2 s^2)`` times ``||v||^2``, which grows
    with ``log d`` where the L2 norm's ``sqrt(d)/s`` (QSGD Lemma 3.1) grows with ``sqrt d``
    -- so 2-bit codes can share one norm among 128 values (L2 needed 16: 0.158 of fp32's
    bytes at 2 ranks, now 0.104; docs/ddp.md has the measured trade-off)."""
    if values.get("norm", "inf") == "l2":
        return chunk_for_bits(values)
    return max(128, chunk_for_bits(values))


def _index_bits(n_scales: int) -> int:
    need = max(1, (n_scales - 1).bit_length())
    return next(b for b in SUPPORTED_BITS if b >= need)


def exact_step(a0: float, a1: float) -> float | None:
    """A float32 ``d`` with ``fl32(a0 + d) == a1`` (so ``a0 + c*d`` is exactly the table
    entry for ``c`` in {0, 1}: a two-entry lookup in one fused pass), or None."""
    f0, f1 = np.float32(a0), np.float32(a1)
    with np.errstate(over="ignore", invalid="ignore"):
        d = np.float32(f1 - f0)
        for _ in range(4):
            got = np.float32(f0 + d)
            if got == f1:
                return float(d)
            if not np.isfinite(got):
                return None
            d = np.nextafter(d, np.float32(np.inf) if got < f1 else np.float32(-np.inf))
    return None


def pack_index_bits(index: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack scale indices (uint8, or a float tensor of small integers). One bit on
    the CPU: ``numpy.packbits(..., bitorder="little")``, the same bytes as
    :func:`perfsim.kernels.pack_bits` (checked against the reference in the tests)
    at ~15x the speed of the generic packer for 1-bit codes."""
    if bits == 1 and not index.is_cuda:
        return torch.from_numpy(np.packbits(index.contiguous().numpy() != 0, bitorder="little"))
    if index.dtype != torch.uint8:
        index = workspace("ms_idx", index.numel(), torch.int32, index.device).copy_(index).to(torch.uint8)
    return pack_bits(index, bits)


def unpack_index_bits(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """uint8 scale indices of a payload (see :func:`pack_index_bits`); may be scratch."""
    if bits == 1 and not packed.is_cuda and packed.dtype == torch.uint8 and packed.numel() == packed_nbytes(n, 1):
        return torch.from_numpy(np.unpackbits(packed.contiguous().numpy(), bitorder="little", count=n))
    return unpack_codes(packed, bits, n)  # checks dtype / size (ConfigError)


class MaxNormQuantizer(_SeededCompressor):
    """Shared implementation of QSGDMaxNorm (one scale) and its multi-scale variant."""

    allreduce_compatible = True
    #: integer codes on a shared scale sum element-wise; their lanes split by words
    reduce_scatter_compatible = True
    stateful = True  # the random step counter

    @property
    def scales(self) -> torch.Tensor:
        """Levels ``s_j`` of every scale, ascending, as float32."""
        if self._scales is None:
            self._scales = torch.tensor([levels_for_bits(b) for b in self.scale_bits],
                                        dtype=torch.float32)
        return self._scales

    def __init__(self, bits: int, scale_bits: Sequence[int] = (), bucket: int = 1, seed: int = 0,
                 chunk: int = 0, norm: str = "l2"):
        self.bits = int(bits)
        sb = sorted({int(bits), *map(int, scale_bits)})
        self.scale_bits = tuple(sb)
        self._scales = None  # the float32 tensor of levels, built on first use (no torch for sizes)
        self.s = levels_for_bits(self.bits)  # s_min: bounds every code
        bad = [int(b) for b in scale_bits if not self.bits < int(b) <= MAX_SCALE_BITS]
        if bad:
            raise ConfigError(f"scale bits {bad[0]}: must be in ({self.bits}, {MAX_SCALE_BITS}]")
        self.bucket = int(bucket)
        if chunk and self.multiscale:
            raise ConfigError("chunk: the multi-scale variant keeps one norm per tensor "
                              "(its per-coordinate scales already adapt)")
        self.chunk = int(chunk)
        if norm not in NORMS:
            raise ConfigError(f"norm={norm!r}: choose {' or '.join(NORMS)}")
        if norm != "l2" and self.multiscale:
            raise ConfigError("norm: the multi-scale variant keeps the paper's L2 norm (eq. 11)")
        self.norm = norm
        self.seed, self._step, self._salt = int(seed), 0, 0
        self.spec = self.canonical_spec()

    def spec_values(self) -> dict:
        """The attributes, with ``scale_bits`` as the spec writes it: the scales other than ``bits``."""
        return {"bits": self.bits, "scale_bits": self.scale_bits[1:], "bucket": self.bucket,
                "chunk": self.chunk, "norm": self.norm}

    # ------------------------------------------------------------ geometry
    @property
    def multiscale(self) -> bool:
        return len(self.scale_bits) > 1

    def nbuckets(self, n: int) -> int:
        return -(-n // self.bucket) if self.multiscale else 0

    def chunk_of(self, n: int) -> int:
        """Elements per norm: ``chunk``, or the whole tensor when ``chunk=0``."""
        return self.chunk if self.chunk else max(n, 1)

    def nnorms(self, n: int) -> int:
        """Shared norms of an ``n``-element tensor (one per chunk)."""
        return -(-n // self.chunk_of(n)) if n else 0

    def wire_bytes(self, shape: Sequence[int], *, warmup: bool = False) -> int:
        n = numel_of(shape)
        if n == 0:
            return 0
        total = 4 * self.nnorms(n) + packed_nbytes(n, self.bits)
        if self.multiscale:
            total += packed_nbytes(self.nbuckets(n), _index_bits(len(self.scale_bits)))
        return total

    def dp_plan(self, shape: Sequence[int], world_size: int, *, backend: str = "gloo") -> list[CommStep]:
        """max-allreduce of the norms, [min-allreduce of scale indices], sum-allreduce
        of the codes packed in lanes of ``b + ceil(log2 W)`` bits (:mod:`perfsim.kernels.lanes`).

        ``backend="nccl"``: NCCL has no bitwise reduction, so the scale indices
        travel as one uint8 per bucket with a MIN reduction (as in the paper's code)."""
        n = numel_of(shape)
        if n == 0:
            return []
        if world_size < 1:
            raise ConfigError(f"world_size={world_size}: must be >= 1")
        plan = [CommStep(ALLREDUCE, 4 * self.nnorms(n), "max", f"{self.spec} norms")]
        if self.multiscale:
            if backend == "nccl":
                plan.append(CommStep(ALLREDUCE, self.nbuckets(n), "min", f"{self.spec} scale-index min (uint8)"))
            else:
                nbytes = packed_nbytes(self.nbuckets(n) * (len(self.scale_bits) - 1), 1)
                plan.append(CommStep(ALLREDUCE, nbytes, "min", f"{self.spec} scale-index min (thermometer bits, AND)"))
        words = packed_words(n, self.bits, world_size)
        plan.append(CommStep(ALLREDUCE, 8 * words, "sum",
                             f"{self.spec} codes ({lane_bits(self.bits, world_size)}-bit lanes in int64)"))
        return plan

    # ------------------------------------------------------------ math
    def local_norm(self, x: torch.Tensor) -> torch.Tensor:
        """``||chunk||_2`` of every chunk (fp32, the max-allreduce input); see
        :func:`perfsim.compression.qsgd.safe_norms` for values near the float32 limit."""
        flat = flat_f32(x)
        return safe_norms(flat, self.chunk_of(flat.numel()), self.spec, NORMS[self.norm])

    def _bucket_amax(self, flat: torch.Tensor) -> torch.Tensor:
        """``max |v|`` per bucket; for ``bucket=1`` ``|v|`` in a scratch buffer."""
        n = flat.numel()
        if self.bucket == 1:
            return torch.abs(flat, out=workspace("ms_abs", n, torch.float32, flat.device))
        nfull = n // self.bucket
        full = nfull * self.bucket
        out = torch.empty(self.nbuckets(n), dtype=torch.float32, device=flat.device)
        if nfull:
            torch.amax(flat[:full].view(nfull, self.bucket).abs(), dim=1, out=out[:nfull])
        if full < n:
            out[nfull] = flat[full:].abs().amax()
        return out

    def thresholds(self, norm) -> list[float]:
        """Per extra scale ``s_j`` (j >= 1), the largest float32 ``t_j`` with
        ``fl32(t_j * s_j) <= fl32(W * s_min)``: eq. 11's test ``s_j |v| <= W s_min``
        evaluated in float32 is exactly ``|v| <= t_j`` (the product is monotone in
        ``|v|``), one compare per element instead of a multiply and a compare."""
        limit = np.float32(np.float32(float(norm)) * np.float32(self.s))
        out = []
        with np.errstate(over="ignore"):
            for s_j in self.scales[1:].tolist():
                if not np.isfinite(limit):
                    out.append(float("inf"))
                    continue
                sj = np.float32(s_j)
                c = np.float32(limit / sj)
                while c > 0 and np.float32(c * sj) > limit:
                    c = np.nextafter(c, np.float32(0))
                while True:
                    nxt = np.nextafter(c, np.float32(np.inf))
                    if not np.float32(nxt * sj) <= limit:
                        break
                    c = nxt
                out.append(float(c))
        return out

    def _scale_count(self, flat: torch.Tensor, norm) -> torch.Tensor:
        """Per bucket, the number of scales ``j >= 1`` passing eq. 11, as float32 in a
        scratch buffer: ``le`` with a float output is ~4x faster than with a bool one."""
        amax = self._bucket_amax(flat)  # fresh or scratch: ours to overwrite
        ts = self.thresholds(norm)
        if len(ts) == 1:
            return amax.le_(ts[0])  # in place: one buffer less in the cache
        cnt = torch.le(amax, ts[0], out=workspace("ms_cnt", amax.numel(), torch.float32, amax.device))
        tmp = workspace("ms_tmp", amax.numel(), torch.float32, amax.device)
        for t in ts[1:]:
            cnt.add_(torch.le(amax, t, out=tmp))
        return cnt

    @staticmethod
    def _to_uint8(v: torch.Tensor) -> torch.Tensor:
        """Small non-negative integers (float) -> fresh uint8 (via int32: 2x faster)."""
        return workspace("ms_idx", v.numel(), torch.int32, v.device).copy_(v).to(torch.uint8)

    def local_scale_index(self, flat: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
        """Per bucket, the index of the largest scale with ``s * max|v| <= W * s_min`` (eq. 11).

        uint8 (fresh), in ``[0, N)``; 0 (the smallest scale) always qualifies
        since ``|v| <= W``. The conditions are nested (ascending scales), so the
        index is the number of scales ``j >= 1`` that pass."""
        return self._to_uint8(self._scale_count(flat_f32(flat), norm))

    def levels_per_element(self, index: torch.Tensor | None, n: int) -> torch.Tensor | float:
        """``s*_i`` of every element (float32 tensor), or ``s`` for one scale (tests, analysis)."""
        if not self.multiscale:
            return float(self.s)
        per_bucket = self.scales.to(index.device)[index.long()]
        return per_bucket if self.bucket == 1 else per_bucket.repeat_interleave(self.bucket)[:n]

    def _lookup(self, table: torch.Tensor, index: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out[i] = table[index[i]]`` (exact) for a small float32 table and indices
        given as uint8 or as float32 small integers.

        Two scales (index 0/1): ``t0 + index * d`` with ``fl32(t0 + d) == t1``
        (:func:`exact_step`), one fused pass, or where no such ``d`` exists the
        affine map on the int32 bit patterns (three cheap passes) -- a gather or
        ``torch.where`` costs 3-6x more on a CPU. Otherwise an ``index_select``."""
        if table.numel() == 2:
            t0, t1 = table.tolist()
            d = exact_step(t0, t1)
            if d is not None:
                return torch.add(table[0], index, alpha=d, out=out)
            # no such d (e.g. t0 >> t1): the same affine map on the float bit patterns, in int32
            b0, b1 = table.view(torch.int32).tolist()
            oi = out.view(torch.int32).copy_(index)
            return oi.mul_(b1 - b0).add_(b0).view(torch.float32)
        idx = workspace("ms_idx", index.numel(), torch.int32, index.device).copy_(index)
        return torch.index_select(table, 0, idx, out=out)

    def encode_codes(self, flat: torch.Tensor, norm: torch.Tensor, index: torch.Tensor | None,
                     key: int) -> torch.Tensor:
        """Offset codes ``zeta + s_min`` (uint8 in ``[0, 2 s_min]``, fresh) on the shared
        norm (and shared scale index, uint8 or float32 small integers, per bucket):
        stochastic rounding of ``s*_i v_i / W`` (eq. 8, 12); eq. 11 keeps
        ``|s*_i v_i / W| <= s_min``."""
        n = flat.numel()
        w = torch.as_tensor(norm, dtype=torch.float32).reshape(-1).to(flat.device)
        y = workspace("sr_y", n, torch.float32, flat.device)
        if not self.multiscale:
            scale_into(y, flat, coefficients(float(self.s), w), self.chunk_of(n))
        else:
            table = coefficients(self.scales.to(flat.device).double(), w)  # s_j / W
            if self.bucket > 1 or index.dtype != torch.uint8 and index.dtype != torch.float32:
                scale_into(y, flat, table[index.long()], self.bucket)
            elif float(table.max()) <= float(np.finfo(np.float32).max):
                self._lookup(table.to(torch.float32), index, y).mul_(flat)  # coefficient, then y
            else:  # W below ~1e-30: float64 product (never in practice)
                y.copy_(flat.double() * table[index.long()])
        return stochastic_codes_(y, self.s, key)

    def _scale_levels_(self, out: torch.Tensor, norm: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
        """``out <- out * W / s*_i`` in place (float32 levels -> values, eq. 9 / 13)."""
        if not self.multiscale:
            w = torch.as_tensor(norm, dtype=torch.float32).reshape(-1).to(out.device)
            if w.numel() == 1:
                return out.mul_(float(w) / self.s)
            return bucketwise(torch.mul, out, (w.double() / self.s).float(), self.chunk_of(out.numel()), out)
        d = float(norm) / self.scales.to(out.device)  # float32 table W / s_j
        if self.bucket > 1:
            return bucketwise(torch.mul, out, d[index.long()], self.bucket, out)
        return out.mul_(self._lookup(d, index, workspace("ms_coef", out.numel(), torch.float32, out.device)))

    def decode_levels(self, lv: torch.Tensor, norm: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
        """``W * zeta / s*`` (eq. 9 / 13): works for one worker's codes or for their sum."""
        out = torch.empty(lv.shape, dtype=torch.float32, device=lv.device).copy_(lv)
        return self._scale_levels_(out, norm, index)

    # ------------------------------------------------------------ payload
    def compress(self, x: torch.Tensor, *, key=None, norm: torch.Tensor | float | None = None,
                 scale_index: torch.Tensor | None = None) -> Payload:
        """Encode one worker's ``x``. ``norm`` is the shared max norm ``W`` (default:
        this worker's own norm); ``scale_index`` the shared per-bucket scale indices
        (default: this worker's own). Both must be >= / <= the local values, or the
        codes would not fit: that is a ConfigError."""
        check_float(x)
        flat = flat_f32(x)
        if flat.numel() == 0:
            return Payload({}, tuple(x.shape), x.dtype)  # empty tensor: nothing on the wire
        local = self.local_norm(flat)
        check_finite_norms(local, flat, self.spec)  # NaN/Inf anywhere -> the norm is NaN/Inf
        w = local if norm is None else torch.as_tensor(norm, dtype=torch.float32).reshape(-1).to(flat.device)
        if w.shape != local.shape or not bool(torch.isfinite(w).all()) \
                or bool((w < local * (1 - 1e-6)).any()):
            raise ConfigError(f"{self.spec}: shared norms must be {local.numel()} finite values, "
                              "each >= this tensor's own")
        index = None
        tensors = {"norm": w.clone()}
        if self.multiscale:
            own = self._scale_count(flat, w)  # float32 counts, scratch
            if scale_index is None:
                index = own
            else:
                index = scale_index.to(torch.uint8).reshape(-1).to(flat.device)
                if index.numel() != own.numel() or int(torch.gt(index, self._to_uint8(own)).view(torch.uint8).max()):
                    raise ConfigError(f"{self.spec}: shared scale index must have {own.numel()} entries, "
                                      f"each <= this worker's own (scale sharing takes the minimum)")
            tensors["scale_index"] = pack_index_bits(index, _index_bits(len(self.scale_bits)))
        codes = self.encode_codes(flat, w, index, self._next_key())
        tensors["codes"] = pack_bits(codes, self.bits)
        return Payload(tensors, tuple(x.shape), x.dtype)

    def codec_traffic(self, shape: Sequence[int]):
        """QSGD-MaxNorm (arXiv:2109.12497, Alg. 1; rounding as QSGD's, Alistarh et al.,
        arXiv:1610.02132, for the rounding) as :meth:`compress` runs it: the local norm
        (read 4 n; the multi-scale variant reads the tensor once more for its per-bucket
        scale), :func:`perfsim.compression.qsgd.stochastic_passes`, the bit packing;
        decode: :func:`~perfsim.compression.qsgd.decode_passes`."""
        n, wire = numel_of(shape), self.wire_bytes(shape)
        norms = (4 * n, 4 * n) if self.multiscale else (4 * n,)
        return passes(*norms, *stochastic_passes(n), n + wire), passes(*decode_passes(n, wire))

    def _payload_index(self, payload: Payload, n: int) -> torch.Tensor | None:
        if not self.multiscale:
            return None
        return unpack_index_bits(payload.tensors["scale_index"], _index_bits(len(self.scale_bits)), self.nbuckets(n))

    def payload_levels(self, payload: Payload) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(signed int32 codes, shared norm, scale index or None) of a payload."""
        n = numel_of(payload.shape)
        t = payload.tensors
        lv = unpack_bits(t["codes"], self.bits, n).to(torch.int32) - self.s
        index = None
        if self.multiscale:
            index = unpack_bits(t["scale_index"], _index_bits(len(self.scale_bits)), self.nbuckets(n))
        return lv, t["norm"], index

    def decompress(self, payload: Payload, *, key=None) -> torch.Tensor:
        """``W (c - s_min) / s*``: unpack into a fresh float32 tensor, subtract, scale."""
        n = numel_of(payload.shape)
        if n == 0:
            return torch.zeros(payload.shape, dtype=payload.dtype)  # empty
        t = payload.tensors
        out = torch.empty(n, dtype=torch.float32, device=t["codes"].device)
        levels_from_codes(unpack_codes(t["codes"], self.bits, n), self.s, out)  # consumes the scratch codes
        self._scale_levels_(out, t["norm"], self._payload_index(payload, n))
        return to_dtype_saturating(out.reshape(payload.shape), payload.dtype)

    # ------------------------------------------------------------ data parallel
    def _thermometer(self, index: torch.Tensor) -> torch.Tensor:
        if len(self.scale_bits) == 2:  # one bit per bucket: the index itself
            return pack_index_bits(index, 1)
        j = torch.arange(len(self.scale_bits) - 1, dtype=torch.int32, device=index.device)
        bits = (index.to(torch.int32)[:, None] > j[None, :]).to(torch.uint8).reshape(-1)
        return pack_bits(bits, 1)

    def _from_thermometer(self, packed: torch.Tensor, nb: int) -> torch.Tensor:
        k = len(self.scale_bits) - 1
        if k == 1:
            return unpack_index_bits(packed, 1, nb)
        bits = unpack_bits(packed, 1, nb * k).view(nb, k)
        return bits.sum(dim=1, dtype=torch.int32).to(torch.uint8)

    def allreduce_mean(self, x: torch.Tensor, group=None) -> torch.Tensor:
        """Alg. 1 / Alg. 2 with torch.distributed, exactly :meth:`dp_plan`'s collectives.

        A rank whose input is NaN/Inf (or whose norm overflows) sends +Inf norms, which
        the max-allreduce hands to every rank: all raise :class:`perfsim.errors.NonFiniteError`
        there, before the codes (and the random counter) move (:mod:`perfsim.runtime.nonfinite`)."""
        import torch.distributed as dist  # lazy: torch is heavy, needed only here

        check_float(x)
        world = dist.get_world_size(group)
        self._set_rank_salt(group)
        flat = flat_f32(x)
        if flat.numel() == 0:
            return x.detach().clone()
        try:
            w = self.local_norm(flat)
            check_finite_norms(w, flat, self.spec)
            refused = False
        except ConfigError:  # NaN/Inf or a norm beyond float32: a +Inf norm tells every rank
            w = torch.full((self.nnorms(flat.numel()),), float("inf"), dtype=torch.float32, device=flat.device)
            refused = True
        dist.all_reduce(w, op=dist.ReduceOp.MAX, group=group)  # MaxAllReduce norm
        if refused or not bool(torch.isfinite(w).all()):  # every rank alike, before any state moves
            raise NonFiniteError(f"{self.spec}: NaN/Inf or too large values on a rank; nothing exchanged",
                                 local=refused)
        index = None
        if self.multiscale:  # scale sharing: the minimum index over workers (Alg. 2 line 7)
            if dist.get_backend(group) == "nccl":  # no bitwise reductions in NCCL
                index = self.local_scale_index(flat, w)
                dist.all_reduce(index, op=dist.ReduceOp.MIN, group=group)
            else:
                therm = self._thermometer(self._scale_count(flat, w))
                dist.all_reduce(therm, op=dist.ReduceOp.BAND, group=group)
                index = self._from_thermometer(therm, self.nbuckets(flat.numel()))
        words = self.lane_words(flat, w, index, world)
        dist.all_reduce(words, op=dist.ReduceOp.SUM, group=group)
        out = self.lane_mean(words, flat.numel(), w, index, world)
        return to_dtype_saturating(out.reshape(x.shape), x.dtype)

    def lane_words(self, flat: torch.Tensor, norm: torch.Tensor, index: torch.Tensor | None,
                   world: int) -> torch.Tensor:
        """This worker's offset codes (in ``[0, 2 s]``) packed into lanes wide enough for
        the sum over ``world`` workers: the buffer :meth:`allreduce_mean` all-reduces."""
        return pack_lanes(self.encode_codes(flat, norm, index, self._next_key()), self.bits, world)

    def lane_mean(self, words: torch.Tensor, n: int, norm: torch.Tensor, index: torch.Tensor | None,
                  world: int) -> torch.Tensor:
        """The mean of ``n`` values from the all-reduced lane ``words`` of ``world`` workers."""
        levels = unpack_lanes(words, n, self.bits, world).sub_(world * self.s)
        return self.decode_levels(levels, norm, index).div_(world)

    def dp_codec(self, x: torch.Tensor, world_size: int):
        """:meth:`allreduce_mean`'s own local work (the norm, the scale index as the
        backend computes it -- a thermometer on CPU, the index on CUDA --, the codes
        packed into lanes; then unpacking and decoding the sum), without its collectives."""
        flat = flat_f32(x)
        nb = self.nbuckets(flat.numel())

        def shared():
            w = self.local_norm(flat)
            if not self.multiscale:
                return w, None
            if flat.is_cuda:
                return w, self.local_scale_index(flat, w)
            return w, self._from_thermometer(self._thermometer(self._scale_count(flat, w)), nb)

        w, index = shared()
        # the lanes are linear: world_size workers sending these codes sum to this
        words = self.lane_words(flat, w, index, world_size) * world_size

        def encode():
            norm, idx = shared()
            return self.lane_words(flat, norm, idx, world_size)

        def decode():
            return self.lane_mean(words, flat.numel(), w, index, world_size)
        return encode, decode


@register
class QSGDMaxNorm(MaxNormQuantizer):
    """QSGDMaxNorm (arXiv:2109.12497 Sec. 3.1, Alg. 1)."""

    name = "qsgd-maxnorm"
    example_spec = "qsgd-maxnorm:4"

    spec_args = (BITS_ARG,
                 SpecArg("norm", str, key=True, default="inf", choices=tuple(NORMS), metavar="NORM",
                         note="the per-chunk scale: max-abs (inf) or L2"),
                 SpecArg("chunk", key=True, default=maxnorm_chunk, low=0, metavar="D",
                         note="0 = one norm for the whole tensor"))


def parse_scale_bits(text: str) -> tuple[int, ...]:
    """``'8'`` or ``'6,8'`` (or ``'6+8'``) -> the other scales' bit widths, distinct,
    at most 7 (the range, ``(BITS, 24]``, is checked by :class:`MaxNormQuantizer`)."""
    try:
        out = tuple(int(part) for part in text.replace("+", ",").split(","))
    except ValueError:
        raise ConfigError(f"scales {text!r}: expected bit widths like 8 or 6,8") from None
    if len(set(out)) != len(out):
        raise ConfigError(f"scales {text!r}: repeated scale")
    if len(out) > 7:
        raise ConfigError(f"scales {text!r}: at most 8 scales in all")
    return out


#: ``SCALE_BITS`` of the multi-scale specs: default ``BITS+4``, the paper's two-scale pairs
SCALE_BITS_ARG = SpecArg("scale_bits", parse_scale_bits, default=lambda v: (v["bits"] + 4,),
                         metavar="SCALE_BITS,...", fmt=lambda t: ",".join(map(str, t)))


@register
class QSGDMaxNormMultiScale(MaxNormQuantizer):
    """QSGDMaxNormMultiScale with scale sharing (arXiv:2109.12497 Sec. 3.2, Alg. 2)."""

    name = "qsgd-maxnorm-multiscale"
    example_spec = "qsgd-maxnorm-multiscale:4:8"

    spec_args = (BITS_ARG, SCALE_BITS_ARG, SpecArg("bucket", key=True, default=1, low=1, metavar="B"))
