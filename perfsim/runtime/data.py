"""Real training data that ships with installed software -- nothing is downloaded.

Which data set a model trains on, and its size, is :mod:`perfsim.models.datasets`'s (the
simulator counts an epoch from it without torch); this module loads the samples:

* Text (GPT presets): the English help texts of Python's own documentation,
  ``pydoc_data.topics.topics`` (stdlib, ~0.7 MB), concatenated in sorted-key
  order and read as bytes (byte-level vocabulary of 256). Sample ``i`` is the
  window ``bytes[i*T : i*T + T + 1]`` (input = first ``T``, target = shifted by one).
* Digits (``digits-mlp``): scikit-learn's bundled 8x8 handwritten digits
  (``sklearn.datasets.load_digits``, 1797 samples, 64 features scaled to [0, 1]).

Every sample has a fixed integer id (its index). The ids travel with the
micro-batch through the pipeline: AQ-SGD keys its per-sample message buffers
by them (Alg. 1 of AQ-SGD, "Fine-tuning Language Models over Slow Networks using Activation Compression with Guarantees", arXiv:2206.01299).

Order: epoch ``e`` visits the samples in ``randperm(n)`` drawn from a generator
seeded by ``(seed, e)``; step ``k`` of the run takes the next ``global_batch``
ids of that order. An epoch is ``ceil(n / global_batch)`` steps
(:func:`perfsim.job.steps_per_epoch`, what ``perfsim predict`` counts): its last batch is
completed with the first ids of the same order, as ``torch.utils.data.DistributedSampler``
pads (``drop_last=False``: "add extra samples to make it evenly divisible"), so every
sample is visited each epoch and every step trains a full global batch. The order is a
pure function of ``(seed, step)``, so resuming at a step reproduces it exactly.
"""

from __future__ import annotations

import gzip
import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from perfsim.errors import ConfigError
from perfsim.job import steps_per_epoch
from perfsim.models.datasets import DIGITS, TEXT, corpus_bytes, dataset_name, text_samples, why_not
from perfsim.models.specs import ModelSpec


@lru_cache(maxsize=1)
def text_bytes() -> torch.Tensor:
    """The stdlib pydoc topics (:func:`perfsim.models.datasets.corpus_bytes`) as one uint8 tensor."""
    return torch.frombuffer(bytearray(corpus_bytes()), dtype=torch.uint8).clone()


@lru_cache(maxsize=1)
def digits_arrays() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's digits: (features float32 [1797, 64] in [0,1], labels int64).
    scikit-learn is an optional dependency (the ``digits`` extra).

    Read from the file scikit-learn ships (``sklearn/datasets/data/digits.csv.gz``, the
    one ``load_digits`` parses: 64 pixel columns, then the label) without importing
    scikit-learn, whose import (scipy, pandas) costs every rank more CPU than a short
    digits-mlp run; ``load_digits`` itself where that file is not found."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None:
        raise ConfigError("the digits data (digits-mlp) needs scikit-learn: "
                          "pip install 'perfsim[digits]'")
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    if path.is_file():
        import numpy as np  # lazy: numpy is heavy, needed only here

        with gzip.open(path, "rt", encoding="utf-8") as f:
            table = np.loadtxt(f, delimiter=",")
        data, target = table[:, :-1], table[:, -1].astype(int)
    else:
        from sklearn.datasets import load_digits  # lazy: sklearn is heavy, needed only here

        d = load_digits()
        data, target = d.data, d.target
    x = torch.tensor(data, dtype=torch.float32) / 16.0
    y = torch.tensor(target, dtype=torch.int64)
    return x, y


class Dataset:
    """Indexed samples: ``get(ids) -> (inputs, targets)``."""

    name: str = ""

    def __len__(self) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def get(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # pragma: no cover
        raise NotImplementedError


class TextDataset(Dataset):
    """Byte-level next-token windows of length ``seq_len`` over the pydoc text."""

    name = TEXT

    def __init__(self, seq_len: int, limit: int | None = None):
        self.data = text_bytes().to(torch.int64)
        self.seq_len = seq_len
        n = text_samples(seq_len)
        self.n = min(n, limit) if limit else n
        if self.n < 1:
            raise ConfigError(f"seq_len={seq_len}: longer than the text corpus")

    def __len__(self) -> int:
        return self.n

    def get(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        offs = ids.to(torch.int64)[:, None] * self.seq_len + torch.arange(self.seq_len + 1)[None]
        window = self.data[offs]
        return window[:, :-1].contiguous(), window[:, 1:].contiguous()


class DigitsDataset(Dataset):
    name = DIGITS

    def __init__(self, limit: int | None = None):
        self.x, self.y = digits_arrays()
        self.n = min(len(self.y), limit) if limit else len(self.y)

    def __len__(self) -> int:
        return self.n

    def get(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ids = ids.to(torch.int64)
        return self.x[ids], self.y[ids]


def dataset_for(spec: ModelSpec, limit: int | None = None) -> Dataset:
    """The real dataset of a model preset (``limit`` keeps the first N samples,
    e.g. to make AQ-SGD's uncompressed first epoch short in a benchmark)."""
    if limit is not None and limit < 1:
        raise ConfigError(f"dataset limit={limit}: must be >= 1")
    name = dataset_name(spec)
    if name is None:
        raise ConfigError(why_not(spec))
    return TextDataset(spec.seq_len, limit) if name == TEXT else DigitsDataset(limit)


@dataclass(frozen=True)
class Order:
    """Deterministic, resumable sample order.

    num_samples: dataset size. global_batch: ids per step (all replicas).
    seed: shuffling seed.
    """

    num_samples: int
    global_batch: int
    seed: int

    def __post_init__(self):
        if self.global_batch < 1:
            raise ConfigError(f"global batch={self.global_batch}: must be >= 1")
        if self.global_batch > self.num_samples:
            raise ConfigError(f"global batch={self.global_batch} (macro_batch x dp) exceeds the "
                              f"dataset's {self.num_samples} samples")

    @property
    def steps_per_epoch(self) -> int:
        """``ceil(num_samples / global_batch)`` (:func:`perfsim.job.steps_per_epoch`)."""
        return steps_per_epoch(self.num_samples, self.global_batch)

    def epoch_of(self, step: int) -> int:
        return step // self.steps_per_epoch

    def _perm(self, epoch: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(int(self.seed) * 7919 + 104729 * int(epoch) + 1)
        return torch.randperm(self.num_samples, generator=gen)

    def batch(self, step: int) -> torch.Tensor:
        """Sample ids of ``step`` (global batch, int64): the epoch's last batch completed
        with the epoch's first ids (distinct within the batch: ``global_batch <= num_samples``)."""
        epoch, k = divmod(int(step), self.steps_per_epoch)
        perm = self._perm(epoch)
        ids = perm[k * self.global_batch:(k + 1) * self.global_batch]
        if len(ids) < self.global_batch:
            ids = torch.cat([ids, perm[:self.global_batch - len(ids)]])
        return ids.clone()

    def replica_batch(self, step: int, replica: int, dp: int) -> torch.Tensor:
        """The slice of ``step``'s batch that data-parallel replica ``replica`` trains on."""
        ids = self.batch(step)
        per = self.global_batch // dp
        return ids[replica * per:(replica + 1) * per]
