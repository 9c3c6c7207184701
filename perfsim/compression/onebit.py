"""``onebit`` -- sign + scale compression with worker- and server-side error feedback.

The building block of 1-bit Adam / 1-bit LAMB (Li et al., "1-bit LAMB: Communication
Efficient Large-Scale Large-Batch Training with LAMB's Convergence Speed",
arXiv:2104.06069, Sec. 2.1,
Alg. 1 lines 7-11, Sec. 5): a tensor ``x`` is sent as its signs (1 bit each)
and one float32 scale ``||c||_2 / sqrt(n)``, where ``c = x + e`` includes the
compression error ``e`` left from the previous step (error feedback, Seide et
al. 2014): ``e <- c - scale * sign(c)``. Kernels: :mod:`perfsim.kernels.signpack`.

Data-parallel exchange (:meth:`OneBit.allreduce_mean`), the 3-phase compressed
allreduce of 1-bit Adam / DeepSpeed's NCCL backend (paper Sec. 5):

1. every worker error-compensates and compresses its whole (padded) tensor --
   one scale -- and **alltoall**s it: chunk ``j`` (``C/8`` sign bytes, plus the
   worker's 4 scale bytes) goes to worker ``j``;
2. worker ``j`` decompresses the ``N`` copies of its chunk, averages them, and
   compresses the average with the *server* error buffer (one scale per chunk);
3. an **allgather** of the ``N`` server chunks (``C/8 + 4`` bytes each) gives
   every worker the whole averaged tensor.

``n`` elements are zero-padded to ``N * C`` with ``C = 8 * ceil(n / (8 N))``
so chunks are whole bytes. The scales ride inside the byte buffers (4 bytes
appended to every chunk), so the exchange is exactly two collectives, as
:meth:`dp_plan` reports. gloo supports ``all_to_all_single`` (checked with
torch 2.13), so phase 1 is a true alltoall on gloo and NCCL alike.

Error buffers are state: ``compress`` keeps one worker error per tensor shape,
``allreduce_mean`` one worker error (``N*C``) and one server error (``C``) per
(numel, world size). One compressor instance per fused tensor (1-bit LAMB
fuses all momenta into one buffer, Sec. 4.2). ``state_dict`` saves them all
(DeepSpeed's backends lose them on reload; ours round-trip). An exchange changes
the buffers only once all three phases are done; a worker whose input is NaN/Inf
sends a NaN scale instead of compressing, so every worker refuses the exchange in
phase 2 (ConfigError) and none waits in a collective.
``wire_bytes(shape, warmup=True)`` is the uncompressed float32 size of the
optimizers' warm-up stage.
"""

from __future__ import annotations

import math
from typing import Sequence

from perfsim._lazy import torch

from perfsim.compression.base import ALLGATHER, ALLTOALL, CommStep, Compressor, Payload, check_float, numel_of, passes
from perfsim.compression.directq import check_payload_tensors
from perfsim.compression.registry import register
from perfsim.errors import ConfigError, NonFiniteError
from perfsim.kernels.packing import packed_nbytes
from perfsim.kernels.finite import check_deferred
from perfsim.kernels.signpack import ef_sign_compress, sign_unpack
from perfsim.kernels.bitpack import unpack_bits


def chunk_elems(n: int, world: int) -> int:
    """Elements per worker chunk: ``8 * ceil(n / (8 * world))`` (whole bytes)."""
    return 8 * -(-n // (8 * world)) if n else 0


def _scale_bytes(scale: torch.Tensor) -> torch.Tensor:
    return scale.reshape(1).to(torch.float32).view(torch.uint8)


def _bytes_scale(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float32)


def decode_chunks(rows: torch.Tensor, chunk: int) -> torch.Tensor:
    """``rows``: ``(k, chunk/8 + 4)`` uint8 (signs then a float32 scale) ->
    ``(k, chunk)`` float32 ``+-scale`` values."""
    k = rows.shape[0]
    cb = chunk // 8
    scales = _bytes_scale(rows[:, cb:]).reshape(k, 1)
    bits = unpack_bits(rows[:, :cb].reshape(-1), 1, k * chunk).view(k, chunk)
    out = torch.empty((k, chunk), dtype=torch.float32, device=rows.device).copy_(bits)
    return out.mul_(2 * scales).sub_(scales)  # 0 or 2*scale (exact), then exactly -+scale


@register
class OneBit(Compressor):
    """Error-compensated sign + scale (1-bit Adam / 1-bit LAMB building block)."""

    name = "onebit"
    example_spec = "onebit"
    allreduce_compatible = False  # needs the 3-phase compressed allreduce
    reduce_scatter_reason = "its error-compensated exchange is an all-to-all then an all-gather of signs"
    stateful = True

    def __init__(self, *, seed: int = 0):
        self.seed = int(seed)
        self.worker_err: dict[str, torch.Tensor] = {}
        self.server_err: dict[str, torch.Tensor] = {}
        self.spec = self.canonical_spec()

    # ------------------------------------------------------------- sizes
    def wire_bytes(self, shape: Sequence[int], *, warmup: bool = False) -> int:
        n = numel_of(shape)
        if warmup:
            return 4 * n
        return packed_nbytes(n, 1) + 4 if n else 0

    def dp_plan(self, shape: Sequence[int], world_size: int) -> list[CommStep]:
        n = numel_of(shape)
        if world_size < 1:
            raise ConfigError(f"world_size={world_size}: must be >= 1")
        if n == 0:
            return []
        cb = chunk_elems(n, world_size) // 8
        return [CommStep(ALLTOALL, world_size * (cb + 4), label="onebit: worker signs+scale (alltoall)"),
                CommStep(ALLGATHER, cb + 4, label="onebit: server signs+scale (allgather)")]

    # ------------------------------------------------------------- buffers
    def _err(self, table: dict, name: str, n: int, device) -> torch.Tensor:
        e = table.get(name)
        if e is None:
            e = table[name] = torch.zeros(n, dtype=torch.float32, device=device)
        elif e.device != torch.device(device):
            e = table[name] = e.to(device)
        return e

    def reset(self) -> None:
        """Drop all error buffers (a new compression stage)."""
        self.worker_err.clear()
        self.server_err.clear()

    # ------------------------------------------------------------- data path
    def compress(self, x: torch.Tensor, *, key=None) -> Payload:
        check_float(x)  # NaN/Inf: the scale (a norm) is checked inside ef_sign_compress
        shape = tuple(x.shape)
        n = x.numel()
        if n == 0:
            return Payload({"signs": torch.zeros(0, dtype=torch.uint8, device=x.device),
                            "scale": torch.zeros(0, dtype=torch.float32, device=x.device)}, shape, x.dtype)
        err = self._err(self.worker_err, "x".join(map(str, shape)) or "scalar", n, x.device)
        packed, scale = ef_sign_compress(x, err)
        return Payload({"signs": packed, "scale": scale.reshape(1).float()}, shape, x.dtype)

    def decompress(self, payload: Payload, *, key=None) -> torch.Tensor:
        check_payload_tensors(payload, ("signs", "scale"), self.spec)
        shape = tuple(payload.shape)
        n = numel_of(shape)
        if n == 0:
            return torch.zeros(shape, dtype=payload.dtype, device=payload.tensors["signs"].device)
        scale = payload.tensors["scale"].reshape(())
        return sign_unpack(payload.tensors["signs"], n, scale).view(shape).to(payload.dtype)

    def codec_traffic(self, shape: Sequence[int]):
        """Error-compensated sign compression (Tang et al., "1-bit Adam",
        arXiv:2102.02888, Alg. 1) as :func:`perfsim.kernels.signpack.ef_sign_compress`
        runs it: a pass reading ``x`` and ``e`` for the scale (the norm must be known before
        any value is scaled), then one reading them again and writing ``e`` and the signs;
        decode: read the signs, write fp32."""
        n, wire = numel_of(shape), self.wire_bytes(shape)
        return passes(8 * n, 12 * n + wire), passes(wire + 4 * n)

    # ------------------------------------------------------------- 3-phase allreduce
    def _phase1(self, x: torch.Tensor, world: int, pending: dict) -> tuple[torch.Tensor, int]:
        """Error-compensated compression of the padded tensor; returns the
        ``(world, C/8 + 4)`` send buffer (row j goes to worker j) and ``C``.

        The updated worker error goes to ``pending`` (committed by the caller once
        the whole exchange succeeded). A NaN/Inf input is not compressed: its rows
        carry a NaN scale, so every worker's phase 2 refuses the exchange at the
        same point and no rank is left waiting in a collective."""
        n = x.numel()
        chunk = chunk_elems(n, world)
        padded = torch.zeros(world * chunk, dtype=torch.float32, device=x.device)
        padded[:n] = x.detach().reshape(-1)
        key = f"ar{n}w{world}"
        send = torch.zeros((world, chunk // 8 + 4), dtype=torch.uint8, device=x.device)
        err = self._err(self.worker_err, key, world * chunk, x.device).clone()
        try:
            packed, scale = ef_sign_compress(padded, err)
        except ConfigError:  # NaN/Inf (or a norm beyond float32): tell the peers, write nothing
            send[:, chunk // 8:] = _scale_bytes(torch.tensor(float("nan")))
            return send, chunk
        pending[("worker", key)] = err
        send[:, : chunk // 8] = packed.view(world, chunk // 8)
        send[:, chunk // 8:] = _scale_bytes(scale)
        return send, chunk

    def _phase2(self, recv: torch.Tensor, n: int, world: int, chunk: int, pending: dict) -> torch.Tensor:
        """Average the received copies of this worker's chunk and re-compress it
        with the server error; returns ``C/8 + 4`` bytes. Raises ConfigError (on
        every worker alike) when a worker sent a NaN scale."""
        scales = _bytes_scale(recv[:, chunk // 8:])
        if not bool(torch.isfinite(scales).all()):
            bad = [int(i) for i in torch.nonzero(~torch.isfinite(scales)).reshape(-1)]
            try:  # a CUDA encode files its bad scale for later (kernels.finite): it is reported here
                check_deferred()
            except ConfigError:
                pass
            raise NonFiniteError(f"{self.spec}: NaN/Inf data on rank(s) {bad}; nothing exchanged")
        avg = decode_chunks(recv, chunk).sum(dim=0) / world
        key = f"ar{n}w{world}"
        err = self._err(self.server_err, key, chunk, recv.device).clone()
        packed, scale = ef_sign_compress(avg, err)
        pending[("server", key)] = err
        return torch.cat([packed, _scale_bytes(scale)])

    def rescale_errors(self, factor: torch.Tensor, rank: int, world: int) -> None:
        """Multiply the error buffers of ``allreduce_mean`` over ``factor.numel()`` values at
        ``world`` ranks by ``factor`` (this rank's server chunk by its slice), when the
        caller changes the units of what it exchanges (a 1-bit optimizer whose
        preconditioner is refreshed: the pending compensation keeps its meaning)."""
        n = factor.numel()
        chunk = chunk_elems(n, world)
        key = f"ar{n}w{world}"
        padded = torch.ones(world * chunk, dtype=torch.float32, device=factor.device)
        padded[:n] = factor.reshape(-1)
        if key in self.worker_err:
            self.worker_err[key] = self.worker_err[key] * padded.to(self.worker_err[key].device)
        if key in self.server_err:
            mine = padded[rank * chunk:(rank + 1) * chunk]
            self.server_err[key] = self.server_err[key] * mine.to(self.server_err[key].device)

    def _commit(self, pending: dict) -> None:
        for (side, key), err in pending.items():
            (self.worker_err if side == "worker" else self.server_err)[key] = err

    @staticmethod
    def _phase3(gathered: torch.Tensor, n: int, chunk: int) -> torch.Tensor:
        return decode_chunks(gathered, chunk).reshape(-1)[:n]

    def allreduce_mean(self, x: torch.Tensor, group=None) -> torch.Tensor:
        import torch.distributed as dist  # lazy: torch is heavy, needed only here

        check_float(x)
        world = dist.get_world_size(group)
        n = x.numel()
        if n == 0:
            return x.detach().clone()
        pending: dict = {}
        send, chunk = self._phase1(x, world, pending)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv.view(-1), send.view(-1), group=group)
        try:
            mine = self._phase2(recv, n, world, chunk, pending)  # raises on every rank alike
        except NonFiniteError as exc:
            exc.local = not any(side == "worker" for side, _ in pending)  # phase 1 refused this input
            raise
        parts = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(parts, mine, group=group)
        out = self._phase3(torch.stack(parts), n, chunk)
        self._commit(pending)  # error buffers change only once the exchange is complete
        return out.view(x.shape).to(x.dtype)

    @staticmethod
    def simulate_allreduce(compressors: list["OneBit"], xs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The same 3-phase exchange in one process: ``compressors[r]`` plays rank
        ``r`` (its error buffers are updated exactly as in a real run). Used by
        tests to check the distributed result bit for bit, and by anyone who
        wants the numerics without a process group."""
        world = len(xs)
        n = xs[0].numel()
        sends = []
        chunk = 0
        pending: list[dict] = [{} for _ in compressors]
        for comp, x, pend in zip(compressors, xs, pending):
            check_float(x)
            s, chunk = comp._phase1(x, world, pend)
            sends.append(s)
        mines = [comp._phase2(torch.stack([sends[k][r] for k in range(world)]), n, world, chunk, pending[r])
                 for r, comp in enumerate(compressors)]
        out = OneBit._phase3(torch.stack(mines), n, chunk)
        for comp, pend in zip(compressors, pending):
            comp._commit(pend)
        return [out.view(x.shape).to(x.dtype).clone() for x in xs]

    # ------------------------------------------------------------- state
    def state_dict(self):
        return {"seed": self.seed,
                "worker_err": {k: v.detach().cpu().clone() for k, v in self.worker_err.items()},
                "server_err": {k: v.detach().cpu().clone() for k, v in self.server_err.items()}}

    def load_state_dict(self, state) -> None:
        unknown = set(state) - {"seed", "worker_err", "server_err"}
        if unknown:
            raise ConfigError(f"{self.spec}: unexpected state keys {sorted(unknown)}")
        self.seed = int(state.get("seed", self.seed))
        self.worker_err = {k: v.clone().float().contiguous() for k, v in state.get("worker_err", {}).items()}
        self.server_err = {k: v.clone().float().contiguous() for k, v in state.get("server_err", {}).items()}


def onebit_error_bound(v: torch.Tensor) -> float:
    """``||Q(v) - v||_2`` for sign+scale ``Q`` with scale ``||v||/sqrt(n)``:
    ``sqrt(2 ||v||^2 - 2 ||v||_2 ||v||_1 / sqrt(n))`` -- at most ``sqrt(2) ||v||``."""
    n = v.numel()
    if n == 0:
        return 0.0
    l2 = float(torch.linalg.vector_norm(v.double()))
    l1 = float(v.double().abs().sum())
    return math.sqrt(max(0.0, 2 * l2 * l2 - 2 * l2 * l1 / math.sqrt(n)))
