"""Models known only by their layers' sizes: the seeds' other models, for the simulator.

A :class:`SizeSpec` lists its layers' parameter counts, boundary activation shapes and
forward FLOPs, computed from the published architecture (each function cites it); there
is no operator list, so a GPU prices its layers by FLOPs and bytes
(:func:`perfsim.engine.compute.generic_times`) and the runtime cannot train it.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfsim.models.specs import LayerSpec


@dataclass(frozen=True)
class SizeSpec:
    """A model as a list of layers (a :class:`perfsim.models.specs.ModelSpec`)."""

    #: preset name (or a workload file's ``name``)
    name: str
    #: tokens of one sample
    tokens_per_sample: int
    #: the layers, in order
    layer_list: tuple[LayerSpec, ...]

    def layers(self) -> list[LayerSpec]:
        return list(self.layer_list)


def _transformer_encoder(name: str, n_layer: int, d: int, seq: int, vocab: int,
                         extra_embed: int = 0) -> list[LayerSpec]:
    """BERT/DeBERTa-style encoder: embedding, ``n_layer`` blocks (12d^2 + 13d params,
    FFN width 4d, as GPT-2), a pooler + 2-way classifier head."""
    block_flops = seq * (2 * 12 * d * d + 4 * seq * d)
    layers = [LayerSpec("embed", vocab * d + extra_embed + 2 * d, (seq, d), float(2 * seq * d))]
    layers += [LayerSpec(f"block{i}", 12 * d * d + 13 * d, (seq, d), float(block_flops))
               for i in range(n_layer)]
    layers.append(LayerSpec("head", d * d + d + 2 * d + 2, (2,), float(2 * (d * d + 2 * d))))
    return layers


def _resnet50() -> list[LayerSpec]:
    """ResNet-50 (He et al. 2016, Table 1) at 224x224: stem, 16 bottlenecks, fc.
    Conv FLOPs = 2 x weights x output pixels; BatchNorm adds 2 params per channel."""
    layers = [LayerSpec("stem", 3 * 64 * 49 + 2 * 64, (64, 56, 56), 2.0 * 3 * 64 * 49 * 112 * 112)]
    c_in, hw = 64, 56
    for stage, (mid, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3))):
        for b in range(blocks):
            if b == 0 and stage > 0:
                hw //= 2
            out = 4 * mid
            w = c_in * mid + 9 * mid * mid + mid * out
            params = w + 2 * (mid + mid + out)
            if b == 0:
                params += c_in * out + 2 * out
                w += c_in * out
            layers.append(LayerSpec(f"layer{stage + 1}.{b}", params, (out, hw, hw), 2.0 * w * hw * hw))
            c_in = out
    layers.append(LayerSpec("fc", 2048 * 1000 + 1000, (1000,), 2.0 * 2048 * 1000))
    return layers


def _vgg16() -> list[LayerSpec]:
    """VGG-16 (Simonyan & Zisserman 2015, config D) at 224x224; pooling folded into
    the conv before it."""
    cfg = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]
    layers, c_in, hw, i = [], 3, 224, 0
    for k, c in enumerate(cfg):
        if c == "M":
            continue
        pooled = k + 1 < len(cfg) and cfg[k + 1] == "M"
        out_hw = hw // 2 if pooled else hw
        layers.append(LayerSpec(f"conv{i}", 9 * c_in * c + c, (c, out_hw, out_hw), 2.0 * 9 * c_in * c * hw * hw))
        c_in, hw, i = c, out_hw, i + 1
    for j, (a, b) in enumerate(((512 * 7 * 7, 4096), (4096, 4096), (4096, 1000))):
        layers.append(LayerSpec(f"fc{j}", a * b + b, (b,), 2.0 * a * b))
    return layers


#: the size-only presets (BERT-Large and BERT-Base are transformers: :mod:`perfsim.models.registry`)
SIZE_ONLY: tuple[SizeSpec, ...] = (
    # DeBERTa-v2-xxlarge (He et al. 2021, arXiv:2006.03654): 48 layers, d=1536, vocab 128100,
    # relative-position table 512 x d; sequence 256 (a typical fine-tuning length).
    SizeSpec("deberta-v2-xxlarge", 256, tuple(_transformer_encoder("deberta-v2-xxlarge", 48, 1536, 256, 128100,
                                                                    extra_embed=512 * 1536))),
    SizeSpec("resnet50", 1, tuple(_resnet50())),
    SizeSpec("vgg16", 1, tuple(_vgg16())),
)
