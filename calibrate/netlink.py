"""Calibration ranks inside the emulated network of :mod:`perfsim.netem`.

``perfsim run --emulate-bandwidth`` starts each rank with ``ip netns exec``;
calibration ranks are torch.multiprocessing children instead, so each child
joins its namespace itself with ``setns(2)`` (``os.setns`` from Python 3.12,
libc through ctypes before) before it opens any socket. The links, their
shaping and their cleanup are exactly those of :class:`perfsim.netem.EmulatedNetwork`.
"""

from __future__ import annotations

import ctypes
import os

CLONE_NEWNET = 0x40000000


def enter_namespace(name: str) -> None:
    """Move the calling process into network namespace ``name`` (needs root)."""
    path = f"/run/netns/{name}"
    fd = os.open(path, os.O_RDONLY)
    try:
        if hasattr(os, "setns"):
            os.setns(fd, CLONE_NEWNET)
        else:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.setns(fd, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)
    from perfsim.netem import IFNAME

    os.environ["GLOO_SOCKET_IFNAME"] = IFNAME


class emulated_ranks:
    """Context manager: build the emulated network; ``__enter__`` returns
    (namespace name per rank, IP address per rank)."""

    def __init__(self, world: int, bandwidth_bps: float, latency_s: float = 0.0):
        from perfsim.netem import EmulatedNetwork

        self.net = EmulatedNetwork(world, bandwidth_bps, latency_s)

    def __enter__(self):
        self.net.__enter__()
        if self.net.app_latency_s:
            # the kernel cannot add delay (no sch_netem); raw gloo calibration would
            # measure without it, so refuse rather than record a wrong latency
            self.net.close()
            from perfsim.errors import ConfigError

            raise ConfigError("--emulate-latency: this kernel has no sch_netem, so calibration "
                              "cannot emulate latency; measure with --emulate-latency 0")
        return list(self.net.namespaces), [self.net.address(r) for r in range(self.net.world)]

    def __exit__(self, *exc):
        self.net.__exit__(*exc)
