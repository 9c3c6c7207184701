"""AQ-SGD's per-sample message buffers ``m(xi)``: in RAM or memory-mapped on disk,
full precision or low precision (``m8``/``m4``/``m2``, AQ-SGD, arXiv:2206.01299, App. H.5).

Samples are keyed by their integer id; a slot is allocated on a sample's first
visit (slots in visiting order, capacity doubling). Layout per slot:

* float32 store: ``E`` float32 values (``E`` = elements per sample);
* ``mZ`` store: the sample's ``E`` values quantized with ``Z`` bits
  (:mod:`perfsim.kernels.quant`: one float32 max-abs scale per row of
  ``row`` elements, stochastic rounding keyed by the caller), codes packed
  densely per slot (padded to the packing group so slots stay byte-aligned).

RAM stores are torch tensors on the device of the first batch; disk stores are
``numpy.memmap`` files (``values.bin`` or ``codes.bin`` + ``scales.bin``) in a
directory of their own, ``PATH/aqsgd-<tag>-<pid>-<n>/`` under the spec's
``disk=PATH``, for datasets whose buffers exceed memory (the paper's
GPT2-XL example needs ~1 TB; its authors keep fp16 caches in memmap files).
The live files change at every step, so a checkpoint cannot merely refer to them:
taken inside :func:`snapshot_into` (``perfsim run`` does, with a folder of the
checkpoint's own), :meth:`MessageStore.state_dict` copies them there and a restore
copies that snapshot back over the live files, so a run resumed from any kept
checkpoint -- after a crash one step or many past it, or after the run completed and
removed its live files -- continues from the buffers *of that step*. Outside
:func:`snapshot_into` the state names the live files only (valid until the next
step). ``perfsim run`` removes the live files when the run completes
(:meth:`MessageStore.remove`) and keeps them after a failure.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
from pathlib import Path

from perfsim._lazy import np
from perfsim._lazy import torch

from perfsim.errors import ConfigError
from perfsim.kernels.bitpack import pack_bits_torch, unpack_bits_torch
from perfsim.kernels.packing import group_size, packed_nbytes
from perfsim.kernels.quant import (bucket_absmax, dequantize_codes_ref, encode_coeffs,
                                   quantize_codes_ref)

_SERIAL = itertools.count()
#: the folder a checkpoint being taken copies disk buffers into (:func:`snapshot_into`)
_SNAPSHOT: list[Path] = []


@contextlib.contextmanager
def snapshot_into(folder: str | os.PathLike):
    """While inside, :meth:`MessageStore.state_dict` of a disk store copies its files into
    ``folder`` (a checkpoint's own) and records the copies, which a restore reads."""
    _SNAPSHOT.append(Path(folder))
    try:
        yield
    finally:
        _SNAPSHOT.pop()


class MessageStore:
    """Slots of per-sample messages. ``get`` returns float32 ``(k, E)`` rows (a
    fresh tensor), ``put`` stores them (quantizing for low-precision stores)."""

    def __init__(self, numel: int, row: int, *, mbits: int | None = None,
                 disk: str | None = None, device="cpu", capacity: int = 16, tag: str = "",
                 restore: dict | None = None):
        if numel % row:
            raise ConfigError(f"message store: row {row} does not divide {numel} elements")
        self.numel, self.row, self.mbits = int(numel), int(row), mbits
        self.device = torch.device(device) if disk is None else torch.device("cpu")
        self.disk = disk
        self.count = 0
        self.capacity = 0
        if mbits is not None:
            g, gb = group_size(mbits)
            self.padded = -(-self.numel // g) * g
            self.slot_bytes = packed_nbytes(self.padded, mbits)
        self._files: dict[str, str] = {}
        self._arrays: dict[str, object] = {}
        self.dir = None
        if restore is not None:  # a checkpoint: reopen its buffers, create nothing
            self.load_state_dict(restore)
            return
        if disk is not None:
            # one directory per store, so the two ends of a boundary (or several
            # boundaries on one machine) never share files
            root = Path(disk)
            root.mkdir(parents=True, exist_ok=True)
            sub = root / f"aqsgd-{tag or 'buf'}-{os.getpid()}-{next(_SERIAL)}"
            sub.mkdir(parents=True, exist_ok=True)
            self.dir = sub
        self._grow(max(1, capacity))

    # ---------------------------------------------------------------- layout
    def _layout(self) -> dict[str, tuple[tuple[int, ...], object]]:
        """name -> (per-slot shape, dtype)."""
        if self.mbits is None:
            return {"values": ((self.numel,), np.float32)}
        return {"codes": ((self.slot_bytes,), np.uint8),
                "scales": ((self.numel // self.row,), np.float32)}

    def _grow(self, need: int) -> None:
        if need <= self.capacity:
            return
        cap = max(need, 2 * self.capacity)
        for name, (shape, dtype) in self._layout().items():
            if self.disk is None:
                new = torch.zeros((cap, *shape), dtype=torch.from_numpy(np.zeros(0, dtype)).dtype,
                                  device=self.device)
                old = self._arrays.get(name)
                if old is not None:
                    new[: self.capacity] = old[: self.capacity]
                self._arrays[name] = new
            else:
                path = self._files.get(name) or str(self.dir / f"{name}.bin")
                self._files[name] = path
                old = self._arrays.get(name)
                if old is not None:
                    old.flush()
                    del old
                nbytes = cap * int(np.prod(shape)) * np.dtype(dtype).itemsize
                with open(path, "ab") as fh:
                    fh.truncate(nbytes)
                self._arrays[name] = np.memmap(path, dtype=dtype, mode="r+", shape=(cap, *shape))
        self.capacity = cap

    def allocate(self, k: int) -> list[int]:
        """Slots for ``k`` new samples."""
        self._grow(self.count + k)
        slots = list(range(self.count, self.count + k))
        self.count += k
        return slots

    # ---------------------------------------------------------------- access
    def _read(self, name: str, slots: list[int]) -> torch.Tensor:
        arr = self._arrays[name]
        if self.disk is None:
            return arr[torch.as_tensor(slots, dtype=torch.long, device=self.device)]
        return torch.from_numpy(np.ascontiguousarray(arr[np.asarray(slots, dtype=np.int64)]))

    def _write(self, name: str, slots: list[int], values: torch.Tensor) -> None:
        arr = self._arrays[name]
        if self.disk is None:
            arr[torch.as_tensor(slots, dtype=torch.long, device=self.device)] = values.to(arr.device)
        else:
            arr[np.asarray(slots, dtype=np.int64)] = values.detach().cpu().numpy()

    def view(self, slots: list[int], device) -> torch.Tensor | None:
        """The float32 rows of ``slots`` *in place* (a view that the caller may
        update instead of ``get`` + ``put``) when that is possible: a RAM float32
        store on ``device`` and consecutive slots (a batch of samples first seen
        together -- the usual case). Otherwise ``None``."""
        if self.mbits is not None or self.disk is not None or not slots:
            return None
        arr = self._arrays["values"]
        if arr.device != torch.device(device):
            return None
        first = slots[0]
        if slots != list(range(first, first + len(slots))):
            return None
        return arr[first:first + len(slots)]

    def get(self, slots: list[int], device) -> torch.Tensor:
        """float32 ``(k, E)`` messages of ``slots`` (fresh, contiguous)."""
        k = len(slots)
        if self.mbits is None:
            return self._read("values", slots).to(device=device, dtype=torch.float32).contiguous()
        codes = self._read("codes", slots).to(device)
        scales = self._read("scales", slots).to(device).reshape(-1)
        c = unpack_bits_torch(codes.reshape(-1), self.mbits, k * self.padded)
        c = c.view(k, self.padded)[:, : self.numel].reshape(-1)
        return dequantize_codes_ref(c, scales, self.mbits, self.row).view(k, self.numel)

    def put(self, slots: list[int], values: torch.Tensor, key: int | None) -> None:
        """Store float32 ``(k, E)`` rows; low-precision stores round them with
        the stochastic key ``key`` (``None``: round to nearest)."""
        k = len(slots)
        if k == 0:
            return
        if self.mbits is None:
            self._write("values", slots, values.reshape(k, self.numel))
            return
        vf = values.reshape(-1).float().contiguous()
        s = bucket_absmax(vf, self.row)
        codes = quantize_codes_ref(vf, self.mbits, self.row, encode_coeffs(s, self.mbits), key)
        if self.padded != self.numel:
            codes = torch.nn.functional.pad(codes.view(k, self.numel), (0, self.padded - self.numel))
        packed = pack_bits_torch(codes.reshape(-1), self.mbits).view(k, self.slot_bytes)
        self._write("codes", slots, packed)
        self._write("scales", slots, s.view(k, -1))

    def nbytes(self) -> int:
        """Bytes held per stored sample (the buffer cost the paper discusses)."""
        if self.mbits is None:
            return 4 * self.numel
        return self.slot_bytes + 4 * (self.numel // self.row)

    # ---------------------------------------------------------------- state
    def flush(self) -> None:
        if self.disk is not None:
            for arr in self._arrays.values():
                arr.flush()

    def state_dict(self) -> dict:
        """RAM: copies of the used slots. Disk: the file paths and, inside
        :func:`snapshot_into`, copies of the files in its folder (the live files change
        at the next step)."""
        st = {"count": self.count, "numel": self.numel, "row": self.row, "mbits": self.mbits}
        if self.disk is None:
            st["arrays"] = {k: v[: self.count].detach().cpu().clone() for k, v in self._arrays.items()}
        else:
            self.flush()
            st["files"] = dict(self._files)
            st["capacity"] = self.capacity
            if _SNAPSHOT:
                folder = _SNAPSHOT[-1]
                folder.mkdir(parents=True, exist_ok=True)
                st["snapshot"] = {}
                for name, path in self._files.items():
                    copy = folder / f"{Path(path).parent.name}-{name}.bin"
                    shutil.copyfile(path, copy)
                    st["snapshot"][name] = str(copy.resolve())
        return st

    def remove(self) -> None:
        """Delete a disk store's files and its folder (RAM stores: nothing to do);
        the store is unusable afterwards."""
        if self.disk is None or self.dir is None:
            return

        self._arrays = {}  # drop the memmaps before their files
        shutil.rmtree(self.dir, ignore_errors=True)

    def load_state_dict(self, st: dict) -> None:
        for k in ("numel", "row", "mbits"):
            if st.get(k) != getattr(self, k):
                raise ConfigError(f"message store: checkpoint has {k}={st.get(k)}, "
                                  f"this buffer {getattr(self, k)}")
        count = int(st["count"])
        if self.disk is None:
            if "arrays" not in st:
                raise ConfigError("message store: checkpoint is disk-backed, this buffer is in RAM")
            self.count = 0
            self._grow(max(1, count))
            for k, v in st["arrays"].items():
                self._arrays[k][:count] = v.to(self.device)
        else:
            files = st.get("files")
            if not files:
                raise ConfigError("message store: checkpoint is in RAM, this buffer is disk-backed")
            for name, copy in (st.get("snapshot") or {}).items():  # the buffers of the checkpoint's step
                if not os.path.exists(copy):
                    raise ConfigError(f"message store: checkpoint's buffer copy {copy} is missing")
                live = Path(files[name])
                live.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(copy, f"{live}.restore")
                os.replace(f"{live}.restore", live)
            for path in files.values():
                if not os.path.exists(path):
                    raise ConfigError(f"message store: buffer file {path} is missing (perfsim run "
                                      "removes disk= buffers when a run completes: resume an interrupted "
                                      "run, or start a new one)")
            self._arrays, self._files, self.capacity = {}, dict(files), 0
            self.dir = Path(next(iter(files.values()))).parent
            cap = int(st["capacity"])
            for name, (shape, dtype) in self._layout().items():
                self._arrays[name] = np.memmap(files[name], dtype=dtype, mode="r+", shape=(cap, *shape))
            self.capacity = cap
        self.count = count
