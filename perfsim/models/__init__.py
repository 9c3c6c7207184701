"""Model descriptions shared by the simulator (sizes, operators) and the runtime (torch modules).

One registry maps every preset name to its spec (:mod:`perfsim.models.registry`); every spec
is a :class:`~perfsim.models.specs.ModelSpec`.
"""

from perfsim.models.registry import PRESETS, get_model_spec, get_spec, preset_names
from perfsim.models.specs import LayerSpec, MLPSpec, ModelSpec
from perfsim.models.transformer import TransformerSpec

__all__ = ["PRESETS", "LayerSpec", "MLPSpec", "ModelSpec", "TransformerSpec", "get_model_spec", "get_spec",
           "preset_names"]
