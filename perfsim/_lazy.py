"""Modules imported on first use.

The simulator asks compressors for their exact wire sizes, which needs the
compressor classes but not torch (1-2 s to import): the compression library and
its kernels refer to ``torch`` / ``numpy`` through :class:`LazyModule`, so
``perfsim predict`` never imports them, while anything that touches a tensor
imports them at that moment. ``PERFSIM_TRACE_LAZY=1`` prints where a lazy module
was first needed.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
import types


class LazyModule(types.ModuleType):
    """Stands for module ``name``; the first attribute access imports it. Each
    attribute looked up is then kept on this object, so later lookups are plain
    attribute reads."""

    def __init__(self, name: str):
        super().__init__(name)
        self.__dict__["_lazy_name"] = name

    def _load(self) -> types.ModuleType:
        name = self.__dict__["_lazy_name"]
        if name not in sys.modules and os.environ.get("PERFSIM_TRACE_LAZY"):
            print(f"perfsim: importing {name} for:", file=sys.stderr)
            traceback.print_stack(limit=8)
        return importlib.import_module(name)

    def __getattr__(self, attr: str):
        if attr.startswith("__") and attr.endswith("__") and attr not in ("__version__", "__file__"):
            raise AttributeError(attr)
        value = getattr(self._load(), attr)
        self.__dict__[attr] = value
        return value

    def __dir__(self):
        return dir(self._load())


torch = LazyModule("torch")
np = numpy = LazyModule("numpy")
