"""The compression library: every compressor of the seeds behind one interface.

Importing this package registers the built-in compressors; build one with
:func:`make_compressor` (``"directq:4"``) or a pipeline pair with
:func:`make_pipeline_pair` (``"aqsgd:fw3bw6"``).
"""

import importlib

from perfsim.compression.base import CommStep, Compressor, Payload
from perfsim.compression.registry import (compressor_classes, make_compressor,
                                          make_pipeline_pair, parse_pipeline_spec, register)

# Built-in compressor modules; each registers its classes on import.
for _mod in ("casts", "directq", "aqsgd", "qsgd", "maxnorm", "randk", "ecq", "onebit", "topk", "powersgd"):
    importlib.import_module(f"perfsim.compression.{_mod}")

__all__ = ["CommStep", "Compressor", "Payload", "compressor_classes", "make_compressor",
           "make_pipeline_pair", "parse_pipeline_spec", "register"]
