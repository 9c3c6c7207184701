"""Host cost of execute mode's pipeline messages (perfsim.runtime.pipeline.Messenger).

    python benchmarks/bench_messenger.py [--quick]

Two gloo ranks over loopback. For each payload size it prints the medians of

* ``send``: the sender's ``Messenger.send`` (pickled header, one buffer, ``isend``
  -- which writes at once because the receive is posted ahead);
* ``recv``: the receiver's ``post`` plus its ``recv`` of data that has already
  arrived (header, views into the buffer),

with caches flushed before each call as calibrate does, and without the flush
(``hot``). These are the ``frame_send`` / ``frame_recv`` costs the simulator
charges per message. Where the time comes from and how the receive posted
ahead removes the late-receive stall: ``traces/measured/late_receive_busy_sender.py``.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from perfsim.calibrate import comm  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--quick", action="store_true", help="3 sizes, fewer repeats")
    args = ap.parse_args()
    sizes = (4096, 262144, 4194304) if args.quick else (1024, 8192, 65536, 262144, 1048576, 4194304, 16777216)
    repeats = 9 if args.quick else 31
    rows = {}
    for label, cold in (("flushed", True), ("hot", False)):
        cfg = comm.CommConfig(ops=("framing",), sizes=sizes, warmup=2, repeats=repeats, max_seconds=2.0,
                              timeout_s=300, framing_cold=cold)
        for r in comm.measure_comm(cfg):
            if r.get("op") in ("frame_send", "frame_recv"):
                rows.setdefault(r["size_bytes"], {})[(label, r["op"])] = r["time_s"] * 1e3
    print(f"{'payload':>10} | {'send ms':>8} {'recv ms':>8} | {'send hot':>8} {'recv hot':>8}")
    for size in sizes:
        v = rows.get(size, {})
        cells = [v.get((lab, op), float("nan")) for lab in ("flushed", "hot") for op in ("frame_send", "frame_recv")]
        print(f"{size:>10} | {cells[0]:8.3f} {cells[1]:8.3f} | {cells[2]:8.3f} {cells[3]:8.3f}")


if __name__ == "__main__":
    main()
