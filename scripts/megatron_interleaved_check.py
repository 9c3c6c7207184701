"""perfsim's interleaved 1F1B against an independent implementation of Megatron-LM 2021's
(``tests/engine/megatron_interleaved.py``: its ``forward_backward_pipelining_with_interleaving`` and
``_communicate``, rule by rule): per rank, the idle time and the step time of

* perfsim's event loop with asynchronous sends (its default, ``p2p_exchange=async``) and the
  reference's free-running replay of the same order;
* perfsim's event loop with Megatron's blocking exchanges (``p2p_exchange=blocking``,
  ``p2p_protocol=rendezvous``) and the reference's blocking replay,

on a worked example (p = 4, v = 3, m = 8; each chunk's forward 1 s, backward 2 s, each message
0.1 s) and on the 76.1B row of Megatron-LM's Table 1 (arXiv:2104.04473; the row as
``scripts/megatron_open_data.py`` predicts it; the reference given perfsim's per-chunk compute
and one message time, its bytes over one 200 Gb/s HDR port plus its host and gather costs) --
there also with independent Gaussian noise on each forward's and backward's compute
(:data:`JITTER`; an experiment: with blocking exchanges every step is a meeting of neighbouring
ranks), and the same row without interleaving.

    python scripts/megatron_interleaved_check.py        # ~10 s
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "engine"), str(ROOT / "scripts")]

import megatron_interleaved as meg  # noqa: E402  (the tests' reference)

from perfsim.config import Strategy, System, Workload  # noqa: E402
from perfsim.engine import plan_with_memory, simulate  # noqa: E402
from perfsim.models.specs import LayerSpec  # noqa: E402
from perfsim.profile import Profile  # noqa: E402


def _line(label: str, end: float, idle: list[float]) -> str:
    return f"| {label} | {end:.4f} | " + " / ".join(f"{x:.4f}" for x in idle) + " |"


def worked_example(p: int = 4, v: int = 3, m: int = 8, f: float = 1.0, b: float = 2.0, x: float = 0.1) -> list[str]:
    """The table rows of the worked example (seconds)."""
    numel = 1000
    bw = 4 * numel * 8 / x  # one fp32 message of ``numel`` values takes x seconds
    layers = tuple(LayerSpec(f"l{i}", 0, (numel,), 0.0) for i in range(p * v))
    wl = Workload("toy", layers, (f,) * (p * v), (b,) * (p * v), 1)
    st = Strategy(pp=p, micro_batch=1, macro_batch=m, schedule="interleaved-1f1b", virtual_stages=v)
    common = dict(bandwidth_bps=bw, latency_s=0.0, nic_sharing=False, p2p_control_latency_s=0.0)
    progs = meg.programs(p, m, v)
    out = []
    for label, system, ref in (("async", System(**common), meg.free_running_times),
                               ("blocking", System(**common, p2p_exchange="blocking", p2p_protocol="rendezvous"),
                                meg.blocking_times)):
        res = simulate(wl, st, system, Profile(), replay=False)
        out.append(_line(f"perfsim, {label}", res.summary["iteration_s"], [r["idle_s"] for r in res.stages]))
        end, ends, busy = ref(progs, p, lambda k, mb: f, lambda k, mb: b, x)
        out.append(_line(f"reference, {label}", end, [end - c for c in busy]))
    return out


def row_76b(schedule: str | None = None) -> list[str]:
    """The 76.1B row (``schedule``: instead of its stated interleaved one): perfsim's prediction
    both ways, the reference on its per-chunk costs both ways, and with compute noise."""
    import perfsim.api as api
    import megatron_open_data as mod

    doc, rows = mod.load()
    row = next(r for r in rows if r["params_b"] == 76.1)
    kw: dict = {}

    class _Got(Exception):
        pass

    def capture(**k):  # the row's predict keywords, as the script gives them
        kw.update(k)
        raise _Got

    plain, api.predict = api.predict, capture
    try:
        mod.predict_row(row, doc, schedule=schedule)
    except _Got:
        pass
    finally:
        api.predict = plain
    out = []
    for label, extra in (("async", {}), ("blocking", dict(p2p_exchange="blocking", p2p_protocol="rendezvous"))):
        res = api.predict(**kw, **extra)
        out.append(_line(f"perfsim, {label}", res.summary["pipeline_s"],
                         [r["idle_s"] for r in res.stages if r["replica"] == 0]))
    wl, st, sy, prof = api.build_configs(**kw)
    _, plan, _ = plan_with_memory(wl, st, sy, prof, allow_oom=True)
    p, v, m = plan.pp, plan.table.virtual_stages, plan.num_microbatches
    sp0 = plan.stages[0]
    x = sp0.fw_bytes * 8 / 200e9 + sp0.fw_encode_s + sp0.fw_decode_s
    fwd = [s.fwd_s + s.fwd_tp_s for s in plan.stages]
    bwd = [s.bwd_s + s.bwd_tp_s for s in plan.stages]
    progs = meg.programs(p, m, v)
    for label, ref in (("async", meg.free_running_times), ("blocking", meg.blocking_times)):
        end, ends, busy = ref(progs, p, lambda k, mb: fwd[k], lambda k, mb: bwd[k], x)
        out.append(_line(f"reference, {label} (message {1e3 * x:.2f} ms)", end, [end - c for c in busy]))
    for cv in JITTER:  # each step's compute times independent Gaussian noise, the same draw both ways
        rng = random.Random(0)
        noise = {(kind, k, mb): max(0.0, rng.gauss(1.0, cv)) for kind in "FB" for k in range(p * v) for mb in range(m)}
        ends = [ref(progs, p, lambda k, mb: fwd[k] * noise["F", k, mb], lambda k, mb: bwd[k] * noise["B", k, mb], x)[0]
                for ref in (meg.free_running_times, meg.blocking_times)]
        out.append(f"| reference, compute noise {100 * cv:.0f} % per step: free-running / blocking | "
                   f"{ends[0]:.4f} / {ends[1]:.4f} | blocking {100 * (ends[1] / ends[0] - 1):+.2f} % |")
    return out


#: compute noise (std / mean) of one forward or backward of one chunk, the jitter experiment (no
#: source gives Selene's)
JITTER = (0.02, 0.05)


def main() -> int:
    print("worked example: p = 4, v = 3, m = 8, chunk forward 1 s, backward 2 s, message 0.1 s")
    print("| replay | step s | idle s per rank 0 / 1 / 2 / 3 |\n| --- | ---: | --- |")
    print("\n".join(worked_example()))
    print("\n76.1B row of Table 1 (t 8, p 4, v 3, m 28): pipeline s (up to the last backward), idle per rank")
    print("| replay | pipeline s | idle s per rank 0 / 1 / 2 / 3 |\n| --- | ---: | --- |")
    print("\n".join(row_76b()))
    print("\nthe same row without interleaving (1F1B, v 1: Megatron's forward_backward_pipelining_without_interleaving)")
    print("| replay | pipeline s | idle s per rank 0 / 1 / 2 / 3 |\n| --- | ---: | --- |")
    print("\n".join(row_76b("1f1b")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
