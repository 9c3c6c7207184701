"""Hot-path kernels (imported as ``perfsim.kernels``).

Each kernel has three faces (torchao style): ``<name>_ref`` in plain torch (any
device), a private Triton kernel ``_<name>_triton``, and a public entry that
uses Triton only for CUDA tensors and the reference otherwise.

- :mod:`packing` / :mod:`bitpack`: the dense bit-packing wire format.
- :mod:`rng`: the counter-based hash behind stochastic rounding.
- :mod:`quant`: bucketed uniform quantize + pack, unpack + dequantize.
- :mod:`aqsgd_step`: the fused AQ-SGD delta / quantize / pack / buffer update.
- :mod:`signpack`: 1-bit sign packing with error feedback.
- :mod:`finite`: the Triton encoders' NaN/Inf check, on the device, reported at the next
  decode or :func:`perfsim.kernels.finite.check_deferred`.
"""

from perfsim.kernels.aqsgd_step import aqsgd_receive, aqsgd_step, aqsgd_step_ref
from perfsim.kernels.bitpack import pack_bits, unpack_bits
from perfsim.kernels.packing import (SUPPORTED_BITS, pack_bits_ref, packed_nbytes,
                                     unpack_bits_ref)
from perfsim.kernels.quant import (QUANT_BITS, quantize_pack, quantize_pack_ref,
                                   unpack_dequantize, unpack_dequantize_ref)
from perfsim.kernels.rng import call_key
from perfsim.kernels.signpack import (ef_sign_compress, ef_sign_compress_ref, sign_pack,
                                      sign_pack_ref, sign_unpack, sign_unpack_ref)

__all__ = ["SUPPORTED_BITS", "QUANT_BITS", "pack_bits_ref", "packed_nbytes", "unpack_bits_ref",
           "pack_bits", "unpack_bits", "quantize_pack", "quantize_pack_ref", "unpack_dequantize",
           "unpack_dequantize_ref", "aqsgd_step", "aqsgd_step_ref", "aqsgd_receive", "call_key",
           "ef_sign_compress", "ef_sign_compress_ref", "sign_pack", "sign_pack_ref", "sign_unpack",
           "sign_unpack_ref"]
