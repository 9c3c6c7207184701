"""How ranks meet (perfsim.rank_store): the store is bound on a port the kernel picks as it
binds, so no other process can take the port between the pick and the bind; every launcher
of real ranks uses it, and none picks a port first."""

from __future__ import annotations

import ast
import queue
import socket
import threading
from pathlib import Path

import pytest

from perfsim import rank_store
from perfsim.runtime import run

from _helpers import PIPE_JOB

ROOT = Path(__file__).resolve().parents[2]


def test_a_hosted_store_holds_its_port_from_the_start_and_releases_it_at_the_end():
    """While :func:`rank_store.hosted` runs nothing else can bind its port (it is bound, not
    just found free), a rank joins it there; once it is left, the port is free again."""
    with rank_store.hosted(2, 10.0) as host:
        port = host.port
        assert port > 0 and host.env() == {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                                           rank_store.HOSTED_ENV: rank_store.HOSTED_VALUE}
        with socket.socket() as s, pytest.raises(OSError):
            s.bind(("127.0.0.1", port))
        client = rank_store.join("127.0.0.1", port, 2, 10.0)
        client.set("k", "v")
        assert host.store.get("k") == b"v"
        del client
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_handoff_rank_0_serves_and_the_others_take_its_port_from_the_queue():
    ports, stores = queue.Queue(), {}

    def rank(r):
        stores[r] = rank_store.handoff(r, 3, 10.0, "127.0.0.1", ports)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (2, 1, 0)]  # peers wait first
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(stores) == [0, 1, 2] and ports.empty()
    stores[2].set("from-2", "x")
    assert stores[0].get("from-2") == b"x" and stores[1].port == stores[0].port


def _pick_then_bind_sites(path: Path) -> list[str]:
    """Calls ``X.bind((host, 0))`` in ``path``: a port picked by binding port 0 from Python,
    released, and handed on (a TCPStore bound on port 0 is created in C++, never so)."""
    sites = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "bind"
                and node.args and isinstance(node.args[0], ast.Tuple) and len(node.args[0].elts) == 2
                and isinstance(node.args[0].elts[1], ast.Constant) and node.args[0].elts[1].value == 0):
            sites.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return sites


def test_no_launcher_picks_a_port_before_its_ranks_bind_it():
    """perfsim, calibrate, the scripts and the tests' helpers pick no port to hand on: a port
    found free and released could be taken before the ranks bind it (the fresh-clone CI saw
    "Connection reset by peer", then a 120 s timeout)."""
    files = [f for folder in ("perfsim", "calibrate", "kernels", "scripts", "benchmarks", "tests", "traces")
             for f in sorted((ROOT / folder).rglob("*.py"))]
    assert len(files) > 100
    sites = [s for f in files if f != Path(__file__) for s in _pick_then_bind_sites(f)]
    assert not sites, sites
    assert _pick_then_bind_sites(Path(__file__))  # it finds the recipe (this file's own, on purpose)


@pytest.fixture
def stranger_takes_released_ports(monkeypatch):
    """Whenever this process closes a socket that it bound to port 0 (a port picked to hand
    on), another listener takes that port at once: the race a pick-then-bind loses, made
    certain. Yields the ports taken."""
    taken, held = [], []
    close = socket.socket.close

    def close_and_lose(self):
        try:
            picked = self.family == socket.AF_INET and self.getsockname()[1]
        except OSError:
            picked = None
        close(self)
        if picked and picked in picked_zero:
            picked_zero.discard(picked)
            thief = socket.socket()
            thief.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            thief.bind(("127.0.0.1", picked))
            thief.listen()
            held.append(thief)
            taken.append(picked)

    bind = socket.socket.bind
    picked_zero: set[int] = set()

    def bind_and_note(self, address):
        bind(self, address)
        if isinstance(address, tuple) and len(address) == 2 and address[1] == 0:
            picked_zero.add(self.getsockname()[1])

    monkeypatch.setattr(socket.socket, "close", close_and_lose)
    monkeypatch.setattr(socket.socket, "bind", bind_and_note)
    try:
        yield taken
    finally:
        monkeypatch.undo()
        for s in held:
            s.close()


def test_stranger_fixture_takes_a_port_picked_then_released(stranger_takes_released_ports):
    """The fixture does what it says: a port found free by binding port 0 is taken as soon as
    it is released, and binding it again fails."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert stranger_takes_released_ports == [port]
    with socket.socket() as s, pytest.raises(OSError):
        s.bind(("127.0.0.1", port))


def test_run_starts_although_every_picked_port_is_taken_at_once(stranger_takes_released_ports, tmp_path):
    """``perfsim run``'s launcher serves its ranks' store on a port bound as it is picked:
    with every released pick taken by a stranger the job still meets and trains (before,
    ``free_port()`` released its port and rank 0 failed to bind it: "address already in
    use"), and its ranks leave without aborting."""
    out = tmp_path / "run"
    result = run(**dict(PIPE_JOB, pp=2, steps=2), out=out)
    assert result.summary["steps"] == 2
    logs = {p.name: p.read_text(errors="replace") for p in (out / ".ranks").glob("rank*.log")}
    assert len(logs) == 2 and not any("terminate called" in t for t in logs.values()), logs
