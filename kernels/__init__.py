"""Hot-path kernels (imported as ``perfsim.kernels``).

Each kernel has three faces (torchao style): ``<name>_ref`` in plain torch (any
device), a private Triton kernel, and a public entry that uses Triton only for
CUDA tensors and the reference otherwise.
"""

from perfsim.kernels.packing import (SUPPORTED_BITS, pack_bits_ref, packed_nbytes,
                                     unpack_bits_ref)

__all__ = ["SUPPORTED_BITS", "pack_bits_ref", "packed_nbytes", "unpack_bits_ref"]
