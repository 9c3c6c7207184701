"""The compression library: every compressor of the seeds behind one interface.

Build one with :func:`make_compressor` (``"directq:4"``) or a pipeline pair with
:func:`make_pipeline_pair` (``"aqsgd:fw3bw6"``); specs are parsed by
:mod:`perfsim.compression.spec` (no torch). The compressor modules (and torch)
load on first use of anything else here; loading registers the built-ins.
"""

import importlib

from perfsim.compression.spec import Spec, parse_spec

#: built-in compressor modules; each registers its classes on import
BUILTINS = ("casts", "directq", "aqsgd", "qsgd", "maxnorm", "randk", "ecq", "onebit", "topk",
            "powersgd")
_LAZY = {"CommStep": "base", "Compressor": "base", "Payload": "base",
         "compressor_classes": "registry", "make_compressor": "registry",
         "make_pipeline_pair": "registry", "check_spec": "registry", "register": "registry"}


_loaded = False


def load_builtins() -> None:
    """Import (and so register) every built-in compressor, once (a planner builds compressors for
    every candidate)."""
    global _loaded
    if not _loaded:
        for mod in BUILTINS:
            importlib.import_module(f"perfsim.compression.{mod}")
        _loaded = True


def __getattr__(name: str):
    if name in _LAZY:
        load_builtins()
        return getattr(importlib.import_module(f"perfsim.compression.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'perfsim.compression' has no attribute {name!r}")


__all__ = ["CommStep", "Compressor", "Payload", "Spec", "check_spec", "compressor_classes", "make_compressor",
           "make_pipeline_pair", "parse_spec", "register"]
