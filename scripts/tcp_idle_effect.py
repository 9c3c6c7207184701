"""How much TCP slow start after idle (perfsim.tcp.SlowStart, ``--tcp-slow-start-after-idle on``)
adds to the README's AQ-SGD pipeline (the embedded default: GPT2-1.5B on 8 GPipe stages, the
AQ-SGD paper's V100 times, 32 micro-batches), uncompressed (fp32) and compressed
(aqsgd:fw3bw6), over slow links with a round trip. A mechanism's measured effect, not a
validation: no run here had a kernel round trip (docs/model.md, "Slow start after idle").

    python scripts/tcp_idle_effect.py            # the table of docs/validation.md (~5 s)
    python scripts/tcp_idle_effect.py --rtt 40ms --bandwidth 100Mbps --schedule 1f1b

Per row: the iteration with the mechanism off (today's default) and on, the change, the
messages that restarted (their window below the pipe's after an idle spell past the RTO) and
the seconds the restarts added to those messages; per link and round trip the gap it opens
between the uncompressed and the compressed row (fp32's change minus aqsgd's, points).
"""
from __future__ import annotations

import argparse
import sys

import perfsim
from perfsim.network.flows import FlowBackend
from perfsim.tcp import SlowStart
from perfsim.units import parse_bandwidth, parse_time

COMPRESS = ("fp32", "aqsgd:fw3bw6")


def _counted(kw: dict) -> tuple[float, int, float]:
    """(iteration seconds, restarted messages, seconds they added) with the mechanism on, the
    counts of the steady iteration's last run (the one seeded with the previous iteration's
    history, when the engine ran it: perfsim.engine.simulate)."""
    runs: list[tuple[FlowBackend, list]] = []
    plain_init, plain_delay = FlowBackend.__init__, SlowStart.delay

    def init(self, *args, **kw):
        plain_init(self, *args, **kw)
        runs.append((self, [0, 0.0]))

    def delay(self, *args):
        extra, cwnd = plain_delay(self, *args)
        if extra > 0:
            runs[-1][1][0] += 1
            runs[-1][1][1] += extra
        return extra, cwnd

    FlowBackend.__init__, SlowStart.delay = init, delay
    try:
        it = perfsim.predict(**kw, tcp_slow_start_after_idle="on").summary["iteration_s"]
    finally:
        FlowBackend.__init__, SlowStart.delay = plain_init, plain_delay
    steady = runs[1] if len(runs) > 1 and runs[1][0].history else runs[0]
    return it, steady[1][0], steady[1][1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--bandwidth", default="10Mbps,100Mbps,400Mbps", help="comma list")
    ap.add_argument("--rtt", default="20ms,50ms", help="round trips, comma list (latency = RTT / 2)")
    ap.add_argument("--schedule", default="gpipe", help="pipeline schedule (the README's: gpipe)")
    args = ap.parse_args(argv)
    try:
        bws = [parse_bandwidth(b, "--bandwidth") for b in args.bandwidth.split(",")]
        rtts = [parse_time(r, "--rtt") for r in args.rtt.split(",")]
    except perfsim.ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        table(bws, rtts, args.schedule)
    except perfsim.ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def table(bws: list[float], rtts: list[float], schedule: str) -> None:
    """Print the rows (module docstring)."""
    print(f"{'link':>9} {'RTT':>6} {'compress':>13} {'off s':>9} {'on s':>9} {'change':>8} "
          f"{'restarts':>8} {'added s':>8}")
    for bw in bws:
        for rtt in rtts:
            change = {}
            for c in COMPRESS:
                kw = dict(bandwidth=bw, latency=rtt / 2, compress=c, schedule=schedule)
                off = perfsim.predict(**kw).summary["iteration_s"]
                on, n, added = _counted(kw)
                change[c] = 100 * (on / off - 1)
                print(f"{bw / 1e6:>5.0f}Mbps {rtt * 1e3:>4.0f}ms {c:>13} {off:>9.3f} {on:>9.3f} "
                      f"{change[c]:>+7.2f}% {n:>8d} {added:>8.3f}")
            print(f"{'':>9} {'':>6} gap fp32 - aqsgd: {change['fp32'] - change['aqsgd:fw3bw6']:+.2f} points")


if __name__ == "__main__":
    sys.exit(main())
