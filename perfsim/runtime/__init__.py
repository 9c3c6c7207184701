"""Execute mode: real torch.distributed training, measured in the schema of a prediction.

The public names (``from perfsim.runtime import run, Messenger, ...``), each from
the module that defines it; they load on first use, so importing this package
(or :mod:`perfsim.runtime.config`) does not import torch:

* training: :func:`run` (``perfsim run``, also :func:`perfsim.run`),
  :func:`make_config` (flag-style keywords -> :class:`RunConfig`),
  :func:`under_torchrun`, the failures :class:`RankFailure` and
  :class:`TrainingDiverged`, :func:`load_result` (a run folder -> Result);
* pipeline: :class:`Messenger` (a stage's message path between ranks),
  :func:`header_capacity`, :class:`StageRunner`; stage building
  :func:`build_stage`, :func:`build_stages`, :func:`build_layer`, :func:`boundary_shape`;
* data-parallel gradient sync: :class:`GradSync`, :func:`make_buckets`, :func:`sync_gradients`
  (the spec they take is a value, :class:`perfsim.compression.spec.Spec`);
* the 1-bit optimizers (1-bit Adam, arXiv:2102.02888; 1-bit LAMB, arXiv:2104.06069):
  :class:`OneBitAdam`, :class:`OneBitLamb`;
* tensor parallelism: :class:`RankLayout` (its rules: :func:`perfsim.models.tensor_parallel.check_tp`).
"""

from __future__ import annotations

import importlib

#: public name -> the module (under perfsim.runtime) that defines it
_HOMES = {
    "run": "_entry", "make_config": "_entry", "under_torchrun": "_entry",
    "RunConfig": "config",
    "RankFailure": "launch",
    "TrainingDiverged": "launch",
    "load_result": "measure",
    "Messenger": "pipeline", "header_capacity": "pipeline", "StageRunner": "pipeline",
    "build_stage": "models", "build_stages": "models", "build_layer": "models", "boundary_shape": "models",
    "GradSync": "grad_sync",
    "make_buckets": "grad_sync", "sync_gradients": "grad_sync",
    "OneBitAdam": "onebit_optim", "OneBitLamb": "onebit_optim",
    "RankLayout": "layout",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'perfsim.runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"perfsim.runtime.{home}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
