"""Real slow links on one machine: every rank in its own network namespace.

``EmulatedNetwork(world, bandwidth_bps, latency_s)`` builds, as a context
manager::

    namespace perfsim-<pid>-<n>-br:  bridge br0 with ports vr0 .. vr{N-1}
    namespace perfsim-<pid>-<n>-r<i>: eth0 = 10.77.0.<i+1>/24, the peer of vr<i>

and shapes both directions of every rank's link with ``tc``: the rank's egress
(``eth0``: ``netem delay <latency>`` with a ``tbf rate <bandwidth>`` child) and
its ingress (the bridge port ``vr<i>``: ``tbf rate <bandwidth>``). Kernels
without ``sch_netem`` (some VM guest kernels have tbf/htb but no netem) get the
bandwidth from tbf and the latency from the runtime's
messenger (:attr:`EmulatedNetwork.app_latency_s`, see
:mod:`perfsim.runtime.pipeline`); gloo collectives then see no added latency. So each rank
has a full-duplex NIC of that rate, and a message from rank a to rank b sees
one-way latency ``latency`` and the bottleneck ``bandwidth`` -- the NIC model of
the simulator. Ranks run with ``ip netns exec`` and gloo binds to ``eth0``
(``GLOO_SOCKET_IFNAME``). Only traffic between the namespaces created here is
shaped; the host's own interfaces are never touched.

Cleanup: everything lives in namespaces named ``perfsim-<pid>-...``; deleting
the namespaces removes the veths, the bridge and the qdiscs with them. Deletion
runs on normal exit, on exceptions, on Ctrl-C and on SIGTERM/SIGHUP (turned
into KeyboardInterrupt while the context is open). Teardown is idempotent and
runs with TERM/INT/HUP blocked, so a second Ctrl-C cannot cut it short; a
namespace is recorded before it is created, so none escapes it.
:func:`cleanup_stale` (run by every new emulated run, and by ``python -m
perfsim.netem --cleanup``) removes the namespaces of runs that are provably
dead -- their pid is gone, or now belongs to a process started after the
namespace was made -- and first SIGKILLs whatever still runs inside them.

Rates: tc's tbf keeps its bucket as a 32-bit time in scheduler ticks and its
queue limit in 32-bit bytes; with perfsim's bucket (:func:`perfsim.shaping.tbf_burst_bytes`)
and 200 ms queue, rates from :data:`perfsim.shaping.MIN_RATE_BPS` to
:data:`perfsim.shaping.MAX_RATE_BPS` are
represented exactly (docs/validation.md, "Measurement notes"), so others are
refused before anything is created.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

from perfsim.errors import ConfigError
from perfsim.procs import pid_alive, provably_dead
# the shaper's facts (rate range, bucket depth) live below both the emulation and the link model
from perfsim.shaping import check_rate, tbf_burst_bytes

PREFIX = "perfsim-"
_TEARDOWN_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
IFNAME = "eth0"
SUBNET = "10.77.0"
_counter = itertools.count()


def _run(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def check_privileges() -> None:
    """Raise ConfigError unless namespaces and tc can be used here."""
    if os.geteuid() != 0:
        raise ConfigError("--emulate-bandwidth needs root (network namespaces and tc); run as root "
                          "or drop the flag")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise ConfigError(f"--emulate-bandwidth needs the `{tool}` command (iproute2)")
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        raise ConfigError(f"--emulate-bandwidth: `ip netns` is unusable here ({probe.stderr.strip()})")


def netns_available() -> bool:
    """True when :func:`check_privileges` would pass (for test skips)."""
    try:
        check_privileges()
    except ConfigError:
        return False
    return True


def list_namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _provably_dead(pid: int, name: str) -> bool:
    """True when the process that made namespace ``name`` is gone."""
    try:
        made = Path("/run/netns", name).stat().st_mtime
    except OSError:
        return not pid_alive(pid)
    return provably_dead(pid, made)


def _kill_inside(name: str) -> list[int]:
    """SIGKILL every process running in namespace ``name``."""
    out = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout
    pids = [int(p) for p in out.split() if p.isdigit()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def cleanup_stale(include_alive: bool = False) -> list[str]:
    """Delete ``perfsim-<pid>-*`` namespaces of dead runs (all of them with
    ``include_alive``), killing what still runs inside first."""
    check_privileges()
    removed = []
    for name in list_namespaces():
        if not name.startswith(PREFIX):
            continue
        try:
            pid = int(name[len(PREFIX):].split("-")[0])
        except ValueError:
            continue
        if pid == os.getpid() or not (include_alive or _provably_dead(pid, name)):
            continue
        _kill_inside(name)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
        removed.append(name)
    return removed


def _rate(bps: float) -> str:
    return f"{int(round(bps))}bit"


class EmulatedNetwork:
    """Namespaces + veths + tc shaping for ``world`` ranks (a context manager)."""

    ifname = IFNAME

    def __init__(self, world: int, bandwidth_bps: float, latency_s: float = 0.0):
        if world < 1 or world > 250:
            raise ConfigError(f"emulated network: {world} ranks (1..250 supported)")
        check_rate(bandwidth_bps)
        if latency_s < 0:
            raise ConfigError(f"--emulate-latency {latency_s}: must be >= 0")
        self.world, self.bandwidth_bps, self.latency_s = world, float(bandwidth_bps), float(latency_s)
        tag = f"{PREFIX}{os.getpid()}-{next(_counter)}"
        self.bridge_ns = f"{tag}-br"
        self.namespaces = [f"{tag}-r{i}" for i in range(world)]
        self._created: list[str] = []
        #: latency the runtime must add itself (no sch_netem in this kernel); 0 when tc does it
        self.app_latency_s = 0.0
        self._old_handlers: dict[int, object] = {}

    # -- addressing
    def address(self, rank: int) -> str:
        return f"{SUBNET}.{rank + 1}"

    def wrap(self, rank: int, cmd: list[str]) -> list[str]:
        """The command run inside rank ``rank``'s namespace."""
        return ["ip", "netns", "exec", self.namespaces[rank], *cmd]

    # -- shaping
    def _tbf(self) -> list[str]:
        burst = tbf_burst_bytes(self.bandwidth_bps)
        return ["tbf", "rate", _rate(self.bandwidth_bps), "burst", str(burst), "latency", "200ms"]

    def _kernel_has_netem(self, ns: str) -> bool:
        probe = subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root",
                                "netem", "delay", "1ms"], capture_output=True, text=True)
        if probe.returncode == 0:
            subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "lo", "root"],
                           capture_output=True)
            return True
        return False

    def _shape(self, ns: str, dev: str, delay: bool) -> None:
        tc = ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev]
        if delay and self.latency_s > 0 and not self.app_latency_s:
            _run(tc + ["root", "handle", "1:", "netem", "delay", f"{self.latency_s * 1e6:.0f}us",
                       "limit", "100000"])
            _run(tc + ["parent", "1:1", "handle", "10:", *self._tbf()])
        else:
            _run(tc + ["root", "handle", "1:", *self._tbf()])

    # -- lifecycle
    def __enter__(self) -> "EmulatedNetwork":
        check_privileges()
        cleanup_stale()
        self._install_signal_handlers()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def _add_namespace(self, ns: str) -> None:
        self._created.append(ns)  # first: an interrupt during `ip netns add` cannot leak it
        _run(["ip", "netns", "add", ns])

    def _build(self) -> None:
        br = self.bridge_ns
        ipb = ["ip", "-n", br]
        self._add_namespace(br)
        _run(ipb + ["link", "set", "lo", "up"])
        _run(ipb + ["link", "add", "br0", "type", "bridge"])
        _run(ipb + ["link", "set", "br0", "up"])
        if self.latency_s > 0 and not self._kernel_has_netem(br):
            # this kernel has no sch_netem (e.g. a Firecracker guest): the runtime's
            # messenger adds the one-way latency to each p2p message instead
            self.app_latency_s = self.latency_s
        for i, ns in enumerate(self.namespaces):
            self._add_namespace(ns)
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            _run(ipb + ["link", "add", f"vr{i}", "type", "veth", "peer", "name", IFNAME, "netns", ns])
            _run(ipb + ["link", "set", f"vr{i}", "master", "br0"])
            _run(ipb + ["link", "set", f"vr{i}", "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", IFNAME])
            _run(["ip", "-n", ns, "link", "set", IFNAME, "up"])
            self._shape(ns, IFNAME, delay=True)  # rank -> network (uplink, latency)
            self._shape(br, f"vr{i}", delay=False)  # network -> rank (downlink)

    def close(self) -> None:
        """Kill what runs inside and delete every namespace created
        (idempotent). TERM/INT/HUP arriving meanwhile are held back and
        re-raised as KeyboardInterrupt once everything is gone (a signal mask
        would not do: another thread may take the signal, and Python still
        runs its handler in the main thread)."""
        errors = []
        held: list[int] = []
        main = threading.current_thread() is threading.main_thread()
        saved = {sig: signal.signal(sig, lambda signum, frame: held.append(signum))
                 for sig in _TEARDOWN_SIGNALS} if main else {}
        try:
            while self._created:
                ns = self._created[-1]
                _kill_inside(ns)
                proc = subprocess.run(["ip", "netns", "del", ns], capture_output=True, text=True)
                if proc.returncode != 0 and ns in list_namespaces():
                    errors.append(f"{ns}: {proc.stderr.strip()}")
                self._created.pop()
        finally:
            for sig, handler in saved.items():
                signal.signal(sig, handler)
            self._restore_signal_handlers()
        if errors:
            print("perfsim netem: could not delete " + "; ".join(errors), file=sys.stderr)
        if held:
            raise KeyboardInterrupt(signal.Signals(held[0]).name)

    def __exit__(self, *exc) -> None:
        self.close()

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def interrupt(signum, frame):
            raise KeyboardInterrupt(f"signal {signum}")

        for sig in (signal.SIGTERM, signal.SIGHUP):
            self._old_handlers[sig] = signal.signal(sig, interrupt)

    def _restore_signal_handlers(self) -> None:
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers.clear()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--cleanup"]:
        try:
            removed = cleanup_stale()
        except ConfigError as exc:
            print(f"perfsim netem: could not clean up: {exc}", file=sys.stderr)
            return 1
        print(f"removed {len(removed)} stale namespace(s)" + (": " + ", ".join(removed) if removed else ""))
        return 0
    print("usage: python -m perfsim.netem --cleanup", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
