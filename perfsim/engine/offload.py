"""CPU offload of the optimizer (``--offload optimizer``): what the step costs.

ZeRO-Offload (Ren et al., "ZeRO-Offload: Democratizing Billion-Scale Model Training",
arXiv:2101.06840, Sec. 4), built on ZeRO-2 (ZeRO-3 in DeepSpeed too): the GPU keeps the 16-bit
weights and runs forward and backward; each rank's reduced gradient shard is copied to host memory
as it is produced (the GPU keeps none), the host's CPUs run Adam on the fp32 master weights,
momentum and variance held there, and the updated 16-bit weights are copied back. The memory side is :func:`perfsim.memory.offloaded_state_bytes`.
Per iteration, per GPU of a stage whose optimizer shard holds ``n`` parameters, with ``W``
bytes per weight (the gradients too: 16-bit under mixed precision), ``B`` the GPU's host
link (:func:`perfsim.hardware.host_link_Bps`) and ``R`` the host's Adam rate per GPU:

* gradients down, ``W n / B`` per micro-batch (the GPU keeps no gradient to accumulate in):
  issued during each backward as each gradient bucket is reduced, on their own stream (Sec. 4.1,
  the single-GPU schedule: the gradient transfer overlaps the backward); exposed only where they
  outlast the stage's backward, ``m max(0, W n / B - t_bwd)`` for ``m`` micro-batches, charged
  with the step;
* the step and the weights up: CPU-Adam updates the master weights tile by tile and copies
  each updated tile's 16-bit weights to the GPU while it updates the next (Sec. 5.1;
  DeepSpeed's ``DeepSpeedCPUAdam`` step with a 16-bit copy), so ``max(n / R, W n / B)``;
* ``R = R_node / g``: a node's ``g`` GPU processes share its CPUs and memory bandwidth
  (:data:`CPU_ADAM_PARAMS_PER_S` per node unless ``--cpu-adam-rate`` gives one).

Not modelled: the one-step delayed parameter update (DPU, Sec. 4.1: the CPU step of
iteration ``i`` overlaps the GPU's iteration ``i + 1``, an option used after warm-up); the
host's own additions when it accumulates several micro-batches' gradients; offloading the
parameters too (ZeRO-Infinity, FSDP2's ``CPUOffloadPolicy``).
"""

from __future__ import annotations

#: Adam updates per second a node's CPUs sustain, the CPU-Adam of ZeRO-Offload (arXiv:2101.06840,
#: Table 2: 1B parameters in 0.22 s, 10B in 2.57 s on one DGX-2 host, i.e. 3.9e9-4.5e9 per second;
#: PyTorch's own CPU Adam was 5-8x slower). A memory-bound check: Adam reads p, g, m, v and writes
#: p, m, v in fp32 plus the 16-bit copy, 30 bytes per parameter, so 4e9/s moves 120 GB/s, half of
#: the DGX-2 host's two DDR4 sockets. The middle of the paper's range, a stated assumption
CPU_ADAM_PARAMS_PER_S = 4.0e9
#: the physical range of that rate (the paper's figures), for ``--cpu-adam-rate`` users to compare
CPU_ADAM_RANGE = (3.9e9, 4.5e9)


def offload_step_time(params: float, weight_bytes: int, dp: int, bwd_s: float, microbatches: int,
                      link_Bps: float, node_rate: float | None = None, gpus_sharing: int = 1) -> float:
    """Seconds an offloaded optimizer step adds after the backward on one GPU of a stage with
    ``params`` parameters per rank, ``params / dp`` in its shard (module docstring): the exposed
    part of the ``microbatches`` gradient copies down, each overlapping one backward of
    ``bwd_s``, then ``max(Adam on the host, the weights' copy up)``."""
    shard = params / dp
    rate = (node_rate or CPU_ADAM_PARAMS_PER_S) / max(1, gpus_sharing)
    copy = weight_bytes * shard / link_Bps
    return microbatches * max(0.0, copy - bwd_s) + max(shard / rate, copy)
