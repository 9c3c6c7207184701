"""Encode and decode time of every registered compressor.

For each compressor spec (every registered compressor at every bit width it
accepts, or the specs the user names) and each tensor size, we time
``compress`` (``encode``) on the sender and ``decompress`` (``decode``) on a
separate receiver instance (stateful compressors such as AQ-SGD keep a buffer
on each side), with the tensor on the measuring device: on a GPU the
compression library dispatches to its Triton kernels, on the CPU to the
plain-torch references -- the same code paths the runtime uses.

Raw points are recorded (op ``encode`` / ``decode``, ``name`` = spec,
``size_bytes`` = the fp32 input bytes, ``wire_bytes`` = the payload) and
fitted per spec as a fixed plus a per-byte cost (:mod:`perfsim.calibrate.fit`):
``fit_encode`` / ``fit_decode`` records. The simulator reads the fit for
sizes between the measured ones and the raw points when it wants them.

Tensors are shaped ``(rows, n / rows)`` with ``rows`` samples (8 by default),
like an activation micro-batch; per-sample compressors (AQ-SGD) get the row
ids as their key and are timed in steady state (after the first, uncompressed
visit of each sample has filled their buffers).

Pipeline boundaries are also timed *in situ* (``boundaries``: model, stages,
stage, micro-batch; ``perfsim calibrate`` passes every boundary of the models
and stage counts it calibrates): the codec runs on the boundary's real shape
right after the forward and backward of the pipeline stage that ends there
(execute mode's stage module), as in a training step. What the step leaves
behind decides the cost: ``directq:4`` on a gpt2-tiny activation (8, 64, 128)
takes 0.25 ms hot, 0.16 ms after one block's step, 0.51 ms after stage 0's
forward and backward and 0.48 ms inside ``perfsim run``. These points carry
``shape=AxBxC`` and the model; the simulator prefers them for a boundary of
that shape. The per-byte fits use the ``(rows, n / rows)`` sweep only.

Data-parallel exchanges (``dp_world`` >= 2, the calibration's ranks): a compressor whose
``allreduce_mean`` runs work of its own around its collectives (MaxNorm: norm, codes packed
into lanes; then unpacking and decoding the sum; GlobalRandK-MaxNorm: the selection and its
memory around that; ``Compressor.dp_codec``) gets
``dp_encode`` / ``dp_decode`` points at each sweep size, timed in ``dp_ranks`` processes at
once (``--concurrent``): the ranks of one machine encode at the same moment. On the Intel
Xeon 2-core VM that path took 7.1 ms alone for an 834k-value bucket against 5.0 ms of
compress + decompress, and two processes at once doubled ``encode_codes``
(docs/validation.md). The gradient buckets prefer these records.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import torch

from perfsim.calibrate.fit import fit_records
from perfsim.calibrate.timing import time_op
from perfsim.errors import ConfigError
from perfsim.profile import shape_text

#: bit widths tried for compressors whose spec is ``name:BITS``
BIT_WIDTHS = (1, 2, 3, 4, 6, 8)
#: sizes (fp32 bytes) of the full and the quick sweeps
FULL_SIZES = tuple(4096 * 4**k for k in range(7))  # 4 KB .. 16 MB
QUICK_SIZES = (4096, 65536, 1048576)


def _candidates(name: str, syntax: str) -> list[str]:
    """Specs to try for a class from its ``spec_syntax``: the first form, optional
    ``[...]`` parts dropped, ``BITS`` -> each width, ``FRACTION`` -> 0.1."""
    # optional parts first (they may contain '|', e.g. aqsgd's [:m8|m4|m2]), then the first form
    form = re.sub(r"\[[^\]]*\]", "", syntax or name).split("|")[0].strip()
    parts = form.split(":")[1:]
    if not parts:
        return [name]
    fills = {"FRACTION": ["0.1"], "RATIO": ["0.1"]}
    out = [[name]]
    for part in parts:
        if part == "BITS":
            choices = [str(b) for b in BIT_WIDTHS]
        elif part in fills:
            choices = fills[part]
        elif part.isupper():
            return []  # an argument we cannot guess (rank, levels...): list it explicitly
        else:
            choices = [part]
        out = [o + [c] for o in out for c in choices]
    return [":".join(o) for o in out]


def discover_specs() -> list[str]:
    """Every registered compressor at every bit width it accepts.

    A class may list its own calibration specs in a ``calibration_specs``
    attribute (tuple of spec strings); otherwise candidates come from its
    ``spec_syntax`` (``BITS`` at the usual widths, ``FRACTION`` = 0.1), keeping
    those that build.
    """
    from perfsim.compression.registry import compressor_classes, make_compressor

    specs: list[str] = []
    for name, cls in sorted(compressor_classes().items()):
        listed = getattr(cls, "calibration_specs", None)
        candidates = list(listed) if listed else _candidates(name, getattr(cls, "spec_syntax", ""))
        for spec in candidates:
            try:
                make_compressor(spec)
            except (ConfigError, TypeError, ValueError):
                continue
            specs.append(spec)
    return specs


@dataclass(frozen=True)
class CodecConfig:
    """What to time: ``specs`` (None: all), ``sizes`` in fp32 bytes, device, repeats."""

    specs: tuple[str, ...] | None = None
    sizes: tuple[int, ...] = FULL_SIZES
    device: str = "cpu"
    rows: int = 8
    warmup: int = 2
    repeats: int = 7
    max_seconds: float | None = 2.0
    threads: int | None = None  # torch threads while timing (None: leave as is)
    #: pipeline boundaries timed in situ: (model, stages, stage, micro-batch), the
    #: activation leaving that stage, right after the stage's forward and backward
    boundaries: tuple[tuple[str, int, int, int], ...] = ()
    #: flush the caches before every timed call (``timing.flush_caches``): a codec in a
    #: training step runs right after a forward/backward that evicted its working set
    cold: bool = True
    #: stop repeating a point once its samples agree this well (``timing.time_op``)
    rel_spread: float | None = None
    #: data-parallel workers whose exchange the ``dp_encode`` / ``dp_decode`` points
    #: time (a compressor's own path around its collectives; 0: not timed), and in
    #: how many processes at once (co-located ranks encode at the same time)
    dp_world: int = 0
    dp_ranks: int = 1

    def __post_init__(self):
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"threads={self.threads}: must be >= 1")
        if not self.sizes or any(int(s) < 4 * self.rows for s in self.sizes):
            raise ConfigError(f"sizes={self.sizes}: need sizes >= {4 * self.rows} bytes")
        if self.device not in ("cpu", "cuda"):
            raise ConfigError(f"device={self.device!r}: use cpu or cuda")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("device='cuda': no CUDA device available")
        for model, pp, stage, mb in self.boundaries:
            from perfsim.models.registry import get_model_spec

            n = len(get_model_spec(model).layers())
            if not 2 <= int(pp) <= n or not 0 <= int(stage) < int(pp) - 1 or int(mb) < 1:
                raise ConfigError(f"boundary ({model}, stage {stage} of {pp}, micro-batch {mb}): a "
                                  f"boundary follows stage 0..pp-2 of 2..{n} stages, micro-batch >= 1")
        if self.rel_spread is not None and not self.rel_spread > 0:
            raise ConfigError(f"rel_spread={self.rel_spread}: must be > 0")
        if self.dp_world < 0 or self.dp_world == 1 or self.dp_ranks < 1:
            raise ConfigError(f"dp_world={self.dp_world}, dp_ranks={self.dp_ranks}: dp_world 0 (off) "
                              "or >= 2, dp_ranks >= 1")
        if self.rows < 1 or self.repeats < 1:
            raise ConfigError(f"rows={self.rows}, repeats={self.repeats}: must be >= 1")

    def resolved_specs(self) -> list[str]:
        from perfsim.compression.registry import make_compressor

        if self.specs is None:
            return discover_specs()
        for s in self.specs:
            make_compressor(s)  # raises ConfigError naming a bad spec
        return list(self.specs)


def _boundary(boundary: tuple[str, int, int, int], device: str):
    """(activation shape, (model, step)) of a pipeline boundary: ``step()`` runs the
    forward and backward of the stage that ends there (execute mode's module)."""
    from perfsim.calibrate.layers import layer_input
    from perfsim.models.registry import get_model_spec
    from perfsim.partition import partition_model
    from perfsim.runtime import build_stage

    model, pp, k, mb = boundary
    spec = get_model_spec(model)
    first, end = partition_model(spec, int(pp))[int(k)]
    torch.manual_seed(0)
    stage = build_stage(spec, int(pp), int(k), 0).to(device).train()
    x = layer_input(spec, first, int(mb), dtype=torch.float32, device=device)
    shape = (int(mb), *spec.layers()[end - 1].out_shape)

    def step():
        out = stage(x)
        out.backward(torch.ones_like(out))
        stage.zero_grad(set_to_none=True)
    return shape, (spec.name, step)


def _shape(size_bytes: int, rows: int) -> tuple[int, int]:
    n = max(rows, int(size_bytes) // 4)
    return rows, max(1, n // rows)


def measure_codecs(cfg: CodecConfig, progress: Callable[[str], None] | None = None) -> list[dict]:
    """Raw ``encode``/``decode`` points plus their ``fit_encode``/``fit_decode`` records.

    ``cfg.threads`` (the command sets the threads one rank gets) applies while
    timing: with more intra-op threads than the cores a rank really has, a
    loaded machine makes every parallel region wait for a descheduled thread.
    """
    old_threads = torch.get_num_threads()
    if cfg.threads is not None and cfg.device == "cpu":
        torch.set_num_threads(cfg.threads)
    try:
        records, skipped = _measure(cfg, progress)
    finally:
        torch.set_num_threads(old_threads)
    if cfg.dp_world:
        if progress:
            progress(f"codec data-parallel paths x{cfg.dp_world} in {cfg.dp_ranks} processes")
        if cfg.dp_ranks > 1:
            from perfsim.calibrate.timing import measure_concurrently

            records += measure_concurrently(measure_dp_codecs, cfg, cfg.dp_ranks)
        else:
            records += [{**r, "concurrent_ranks": 1} for r in measure_dp_codecs(cfg)]
    sweep = [r for r in records if "shape" not in r]  # the per-byte fit: the size sweep only
    for op in ("encode", "decode", "dp_encode", "dp_decode"):
        records += fit_records(sweep, op, ("name",))
    records += [{"op": "codec", "skipped": why} for why in skipped]
    return records


def _measure(cfg: CodecConfig, progress) -> tuple[list[dict], list[str]]:
    from perfsim.compression.registry import make_compressor

    records: list[dict] = []
    skipped: list[str] = []
    gen = torch.Generator(device=cfg.device).manual_seed(0)
    points = [(_shape(size, cfg.rows), None) for size in cfg.sizes]
    points += [_boundary(b, cfg.device) for b in dict.fromkeys(cfg.boundaries)]
    for spec in cfg.resolved_specs():
        for shape, situ in points:
            x = torch.randn(shape, device=cfg.device, generator=gen)
            key = torch.arange(shape[0], device=cfg.device)
            sender, receiver = make_compressor(spec, seed=0), make_compressor(spec, seed=0)
            use_key = bool(getattr(sender, "stateful", False))
            kw = {"key": key} if use_key else {}
            try:
                # steady state: the first visit of each sample fills per-sample buffers
                receiver.decompress(sender.compress(x, **kw), **kw)
                x2 = x + 0.01 * torch.randn(shape, device=cfg.device, generator=gen)
                payload = sender.compress(x2, **kw)
            except (ConfigError, TypeError, ValueError, RuntimeError, NotImplementedError) as exc:
                skipped.append(f"{spec}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
                break
            base = {"name": spec, "size_bytes": 4 * x.numel(), "wire_bytes": payload.nbytes,
                    "world_size": 1, "dtype": "float32", "device": cfg.device,
                    "threads": torch.get_num_threads(), "cache": "cold" if cfg.cold else "warm",
                    "micro_batch": shape[0], "model": None}
            # sweep points: flushed caches; boundaries: after their layer's step
            when = dict(cold=cfg.cold) if situ is None else dict(setup=situ[1])
            when.update(warmup=cfg.warmup, repeats=cfg.repeats, device=cfg.device,
                        max_seconds=cfg.max_seconds, rel_spread=cfg.rel_spread)
            if situ is not None:
                base.update(shape=shape_text(shape), model=situ[0], cache="after-layer-step")
            if progress:
                progress(f"codec {spec} {base['size_bytes'] / 1e6:.3g} MB encode")
            t = time_op(lambda *_: sender.compress(x2, **kw), **when)
            records.append({"op": "encode", **base, **t.record()})
            if progress:
                progress(f"codec {spec} {base['size_bytes'] / 1e6:.3g} MB decode")
            t = time_op(lambda *_: receiver.decompress(payload, **kw), **when)
            records.append({"op": "decode", **base, **t.record()})
    return records, skipped


def count_points(cfg: CodecConfig) -> int:
    return len(cfg.resolved_specs()) * (len(cfg.sizes) * (2 if cfg.dp_world else 1) + len(set(cfg.boundaries))) * 2


def measure_dp_codecs(cfg: CodecConfig) -> list[dict]:
    """``dp_encode`` / ``dp_decode`` points: for every spec whose compressor has a
    data-parallel path of its own (:meth:`perfsim.compression.base.Compressor.dp_codec`),
    the local work of one exchange over ``cfg.dp_world`` workers at each sweep size,
    with ``cfg.threads`` torch threads (module-level: it also runs in the processes
    of :func:`perfsim.calibrate.timing.measure_concurrently`)."""
    from perfsim.compression.registry import make_compressor

    if cfg.threads is not None and cfg.device == "cpu":
        torch.set_num_threads(cfg.threads)
    gen = torch.Generator(device=cfg.device).manual_seed(0)
    records = []
    for spec in cfg.resolved_specs():
        for size in cfg.sizes:
            x = torch.randn(_shape(size, cfg.rows), device=cfg.device, generator=gen)
            try:
                paths = make_compressor(spec, seed=0).dp_codec(x, cfg.dp_world)
            except (ConfigError, TypeError, ValueError, RuntimeError, NotImplementedError):
                break  # the size sweep of measure_codecs records why
            if paths is None:
                break
            base = {"name": spec, "size_bytes": 4 * x.numel(), "world_size": cfg.dp_world, "dtype": "float32",
                    "device": cfg.device, "threads": torch.get_num_threads(),
                    "cache": "cold" if cfg.cold else "warm", "model": None}
            for op, fn in zip(("dp_encode", "dp_decode"), paths):
                t = time_op(lambda *_: fn(), cold=cfg.cold, warmup=cfg.warmup, repeats=cfg.repeats,
                            device=cfg.device, max_seconds=None if cfg.dp_ranks > 1 else cfg.max_seconds,
                            rel_spread=None if cfg.dp_ranks > 1 else cfg.rel_spread)
                records.append({"op": op, **base, **t.record()})
    return records
