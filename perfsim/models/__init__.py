"""Model descriptions shared by the simulator (sizes) and the runtime (torch modules)."""

from perfsim.models.specs import MODEL_SPECS, GPTSpec, LayerSpec, MLPSpec, get_model_spec

__all__ = ["MODEL_SPECS", "GPTSpec", "LayerSpec", "MLPSpec", "get_model_spec"]
