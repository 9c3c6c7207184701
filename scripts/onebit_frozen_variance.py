"""Why 1-bit Adam / 1-bit LAMB can diverge after warm-up where Adam / LAMB train.

One process, exact averaging (``compressor="fp32"``, no 1-bit compression at all): the
compression stage's update ``m / (sqrt(v_frozen) + eps)`` with the variance frozen at the
end of warm-up (1-bit Adam, arXiv:2102.02888; 1-bit LAMB, arXiv:2104.06069 Alg. 1).
Data: scikit-learn digits standardised per pixel (``(x - mean) / (std + 1e-3)``), so
pixels that are almost always blank become rare inputs of 10-40 when they do light up;
MLP 64-64-10, batch 64, 300 steps, warm-up 100 (the library default). Prints, every 25
steps, the full-data loss and, for the 1-bit optimizer and for its baseline side by side,
the largest per-coordinate step ``|m_hat| / denom`` of the first layer (Adam's own is at
most ``(1 - b1) / sqrt(1 - b2)`` = 3.16, Kingma & Ba arXiv:1412.6980 Sec. 2.1) and how many
coordinates exceed that bound, then both final losses.

    python scripts/onebit_frozen_variance.py adam 0.02 bfloat16
    python scripts/onebit_frozen_variance.py adam 0.02 float32 --refresh 16 --bound adam
    python scripts/onebit_frozen_variance.py lamb 0.1 float32 --seed 6

``--refresh K`` / ``--bound adam``: the spec options ``onebit-adam:refresh=K:bound=adam``
(perfsim.compression.refresh); ``--seed``: the data order (5 by default). ``--table``
prints docs/ddp.md's table instead: final loss over the baseline's for every variant, for
1-bit Adam at lr 0.02 (bf16, fp32) and 0.01 (fp32) and 1-bit LAMB at lr 0.1 (fp32), data
orders 5, 6 and 7 (about 2 minutes on one core):

    python scripts/onebit_frozen_variance.py --table

``--layers`` for 1-bit Adam prints, per layer and every 25 steps of the compression
stage, how many coordinates have Adam's denominator (Adam's variance of the same gradients,
tracked alongside) above twice the preconditioning one or below half of it, and the update
norm over Adam's for the same momentum:

    python scripts/onebit_frozen_variance.py adam 0.02 float32 --refresh 16 --bound adam --layers

1-bit LAMB's scaling ratio (arXiv:2104.06069 Alg. 1 line 17, the largest element of
frozen over fresh preconditioner): ``--layers`` prints, per layer and every 25 steps of
the compression stage, the ratio ``r`` in use, LAMB's own coefficient ``||x|| / ||u||``
before its clip to ``[0.01, 0.3]``, the update ``|u|`` of the coordinate that sets the
largest element (over the layer's largest), the share of the layer's squared update on
coordinates whose fresh variance is *below* the frozen one, and the update-weighted ratio
``||m / fresh|| / ||m / frozen||``; ``--ratio norm`` runs 1-bit LAMB with that weighted
ratio instead of the largest element (same clips), a diagnostic, not a library option:

    python scripts/onebit_frozen_variance.py lamb 0.1 float32 --refresh 16 --bound adam --layers
    python scripts/onebit_frozen_variance.py lamb 0.1 float32 --refresh 16 --bound adam --ratio norm

``--fresh-noise``: the same statistics under the 1-bit compressor, which needs two gloo
ranks (docs/ddp.md's first table: digits / 16, lr 0.01, warm-up 30, 150 steps, 2 x 32
samples): the fresh variance of the reconstructed gradient against Adam's variance of the
averaged gradient along the same run (an extra fp32 allreduce, for the diagnostic only),
with the 1-bit compressor and with exact averaging (about 30 s):

    python scripts/onebit_frozen_variance.py --fresh-noise
"""

from __future__ import annotations

import argparse
import math
import statistics
from typing import NamedTuple

import torch

from perfsim import rank_store
from perfsim.compression.refresh import step_bound
from perfsim.runtime.data import digits_arrays
from perfsim.runtime.onebit_optim import OneBitAdam, OneBitLamb

STEPS, WARMUP, BATCH = 300, 100, 64
TAIL = 50  # the mean full-data loss of the last TAIL steps: a figure less at the mercy of one spike
LAYERS = ("W1", "b1", "W2", "b2")


class Outcome(NamedTuple):
    final: float        # full-data loss after the last step (inf: the run stopped with its error)
    log: list           # every log_every steps: (step, loss, max |m_hat|/denom of W1, coords > bound)
    tail: float         # mean full-data loss over the last TAIL steps
    layers: list        # with layers=True: (step, {layer: ratio_stats / adam_gap}) every log_every steps
    last: list          # full-data loss of the last 10 steps


class NormRatioLamb(OneBitLamb):
    """1-bit LAMB whose scaling ratio is the update-weighted ratio ``||m / fresh|| /
    ||m / frozen||`` (the layer's update norm with the fresh variance over the one with the
    frozen variance: the same per-element ratio, weighted by where the update is) instead
    of Alg. 1's largest element; clipped the same way. A diagnostic."""

    @staticmethod
    def _scaling_ratio(m, denom, fresh):
        a, b = float((m / fresh).norm()), float((m / denom).norm())
        return a / b if a > 0 and b > 0 else 1.0


def ratio_stats(opt, p: torch.Tensor, step: int) -> dict:
    """After 1-bit LAMB's compression-stage ``step``: its ratio ``r`` in use, LAMB's
    unclipped coefficient ``||x|| / ||u||``, the largest element of frozen / fresh and the
    relative update of the coordinate holding it, the share of the squared update on
    coordinates whose fresh variance is below the frozen one, and the update-weighted ratio."""
    st, g = opt.state[p], opt.param_groups[0]
    b1, b2 = g["betas"]
    w = st.get("master", p).detach().float()
    denom = (st["exp_avg_sq_frozen"] / (1 - b2 ** opt._variance_steps())).sqrt() + g["eps"]
    fresh = (st["exp_avg_sq"] / (1 - b2 ** step)).sqrt() + g["eps"]
    u = (st["exp_avg"] / (1 - b1 ** step) / denom).reshape(-1)
    q = (denom / fresh).reshape(-1)
    i = int(q.argmax())
    return {"r": float(st["last_ratio"]), "lamb": float(w.norm() / u.norm()), "q_max": float(q[i]),
            "u_at_max": float(u[i].abs() / u.abs().max()),
            "mass_fresh_below": float((u[q > 1] ** 2).sum() / (u ** 2).sum()),
            "weighted": NormRatioLamb._scaling_ratio(st["exp_avg"], denom, fresh)}


def standardised_digits() -> tuple[torch.Tensor, torch.Tensor]:
    x, y = digits_arrays()
    x = x * 16.0
    return (x - x.mean(0)) / (x.std(0) + 1e-3), y


def adam_gap(opt, p: torch.Tensor, adam_v: torch.Tensor, step: int) -> dict:
    """After 1-bit Adam's compression-stage ``step``: how many coordinates have Adam's
    denominator (``adam_v``: Adam's variance of the same gradients, tracked alongside) more
    than 2x the preconditioning one, or less than half of it, and the update norm with
    the preconditioning variance over the one with Adam's (same momentum)."""
    st, g = opt.state[p], opt.param_groups[0]
    b1, b2 = g["betas"]
    denom = (st["exp_avg_sq"] / (1 - b2 ** opt._variance_steps())).sqrt() + g["eps"]
    adam = (adam_v / (1 - b2 ** step)).sqrt() + g["eps"]
    m = st["exp_avg"] / (1 - b1 ** step)
    return {"adam_above": int((adam > 2 * denom).sum()), "adam_below": int((2 * adam < denom).sum()),
            "norm_ratio": float((m / denom).norm() / (m / adam).norm())}


def run(alg: str, lr: float, dtype, *, baseline: bool, refresh: int = 0, bound: str = "off",
        seed: int = 5, log_every: int = 0, ratio: str = "max", layers: bool = False) -> Outcome:
    """One run (:class:`Outcome`). The baseline is the same optimizer whose warm-up never
    ends (bit-identical to AdamW / our LAMB). ``ratio="norm"``: 1-bit LAMB with
    :class:`NormRatioLamb`'s ratio; ``layers``: log per layer :func:`ratio_stats` (1-bit
    LAMB) or :func:`adam_gap` (1-bit Adam) every ``log_every`` steps."""
    x_all, y_all = standardised_digits()
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).to(dtype)
    cls = OneBitAdam if alg == "adam" else NormRatioLamb if ratio == "norm" else OneBitLamb
    opt = cls(m.parameters(), lr=lr, warmup=10**9 if baseline else WARMUP, compressor="fp32",
              refresh=refresh, bound=bound)
    g = torch.Generator().manual_seed(seed)
    loss, log, tail, history = float("nan"), [], [], []
    adam_v = [torch.zeros(p.shape) for p in m.parameters()]  # Adam's variance, for adam_gap
    for step in range(1, STEPS + 1):
        idx = torch.randint(0, len(x_all), (BATCH,), generator=g)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(m(x_all[idx].to(dtype)).float(), y_all[idx]).backward()
        try:
            opt.step()
        except Exception as e:  # a diverged run stops with perfsim's one-line error
            print(f"  step {step}: {e}")
            return Outcome(float("inf"), log, float("inf"), history, tail[-10:])
        if layers and alg == "adam":
            for v, p in zip(adam_v, m.parameters()):
                b2 = opt.param_groups[0]["betas"][1]
                v.mul_(b2).addcmul_(p.grad.float(), p.grad.float(), value=1 - b2)
        if step > STEPS - TAIL or log_every and step % log_every == 0:
            with torch.no_grad():
                loss = float(torch.nn.functional.cross_entropy(m(x_all.to(dtype)).float(), y_all))
            tail += [loss] if step > STEPS - TAIL else []
        if log_every and step % log_every == 0 or step == STEPS:
            st = opt.state[m[0].weight]
            b1, b2 = opt.param_groups[0]["betas"]
            n = opt._variance_steps() if step > WARMUP and not baseline else step
            v = st.get("exp_avg_sq_frozen", st["exp_avg_sq"]) / (1 - b2 ** n)
            r = st["exp_avg"].abs() / (1 - b1 ** step) / (v.sqrt() + 1e-8)
            log.append((step, loss, float(r.max()), int((r > step_bound(b1, b2) * (1 + 1e-6)).sum())))
            if layers and step > WARMUP and not baseline:
                history.append((step, {k: ratio_stats(opt, p, step) if alg == "lamb" else adam_gap(opt, p, v, step)
                                       for k, p, v in zip(LAYERS, m.parameters(), adam_v)}))
    return Outcome(loss, log, statistics.mean(tail), history, tail[-10:])


VARIANTS = [("off", 0, "off"), ("refresh=16", 16, "off"), ("bound=adam", 0, "adam"),
            ("refresh=16:bound=adam", 16, "adam")]


def table() -> None:
    print("| run | data order | baseline loss | " + " | ".join(v for v, _, _ in VARIANTS) + " |")
    print("| --- " * (3 + len(VARIANTS)) + "|")
    for alg, lr, dtype in [("adam", 0.02, "bfloat16"), ("adam", 0.02, "float32"), ("adam", 0.01, "float32"),
                           ("lamb", 0.1, "float32")]:
        for seed in (5, 6, 7):
            dt = getattr(torch, dtype)
            base = run(alg, lr, dt, baseline=True, seed=seed)[0]
            ratios = [run(alg, lr, dt, baseline=False, refresh=k, bound=b, seed=seed)[0] / base
                      for _, k, b in VARIANTS]
            print(f"| 1-bit {alg.upper() if alg == 'lamb' else 'Adam'}, lr {lr:g}, {dtype} | {seed} | {base:.3g} | "
                  + " | ".join(f"{r:.2f}x" if r < 100 else f"{r:.1e}x" for r in ratios) + " |", flush=True)


def _noise_rank(rank: int, port: int) -> None:
    """One of :func:`fresh_noise`'s two gloo ranks (rank 0 prints)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from perfsim import ddp as pddp

    torch.set_num_threads(1)
    rank_store.init_group("gloo", rank, 2, 600.0, rank_store.join("127.0.0.1", port, 2, 600.0))
    x_all, y_all = digits_arrays()
    for comp in ("onebit", "fp32"):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
        opt = pddp.onebit_optimizer(DDP(net), "onebit-lamb", lr=0.01, warmup=30, compressor=comp)
        adam_v = [torch.zeros_like(p) for p in net.parameters()]
        g = torch.Generator().manual_seed(5)
        for step in range(1, 151):
            idx = torch.randint(0, len(x_all), (64,), generator=g)[rank::2]
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(net(x_all[idx]), y_all[idx]).backward()
            for v, p in zip(adam_v, net.parameters()):  # Adam's variance of the averaged gradient
                avg = p.grad.detach().clone()
                dist.all_reduce(avg)
                v.mul_(0.999).addcmul_(avg, avg, value=0.001 / 4)
            opt.step()
            if rank == 0 and step in (60, 100, 150):
                parts = []
                for name, p, v in zip(LAYERS, net.parameters(), adam_v):
                    st, live = opt.state[p], v > 0
                    stats = ratio_stats(opt, p, step)
                    denom = (st["exp_avg_sq_frozen"] / (1 - 0.999 ** 30)).sqrt() + 1e-8
                    u = st["exp_avg"] / denom
                    fresh = (st["exp_avg_sq"] / (1 - 0.999 ** step)).sqrt() + 1e-8
                    had = st["exp_avg_sq_frozen"] > 0  # coordinates with a gradient in warm-up
                    parts.append(f"{name}: fresh/Adam v {float((st['exp_avg_sq'][live] / v[live]).median()):.3g}, "
                                 f"rms m/denom {float(u.norm()) / math.sqrt(u.numel()):.2f}, r {stats['r']:.2f}, "
                                 f"largest frozen/fresh where v > 0 {float((denom / fresh)[had].max()):.2g} "
                                 f"({int((~had).sum())} with v = 0), weighted {stats['weighted']:.2g}")
                print(f"{comp:6s} step {step}: " + " | ".join(parts), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def fresh_noise() -> None:
    """1-bit LAMB's fresh variance (Alg. 1 lines 15-16) under the 1-bit compressor and
    with exact averaging, against Adam's variance of the averaged gradient: per layer the
    median ratio over coordinates, the RMS of the exchanged momentum over the frozen
    denominator, the scaling ratio in use, the largest element of frozen over fresh among
    coordinates that had a gradient in warm-up (and how many had none), and the
    update-weighted ratio."""
    import torch.multiprocessing as mp

    with rank_store.hosted(2, 600.0) as host:  # the ranks' store, bound as its port is picked
        mp.spawn(_noise_rank, args=(host.port,), nprocs=2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    ap.add_argument("alg", nargs="?", choices=["adam", "lamb"])
    ap.add_argument("lr", nargs="?", type=float)
    ap.add_argument("dtype", nargs="?", choices=["float32", "bfloat16"])
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--fresh-noise", action="store_true")
    ap.add_argument("--refresh", type=int, default=0)
    ap.add_argument("--bound", default="off")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--ratio", choices=["max", "norm"], default="max")
    ap.add_argument("--layers", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.table:
        return table()
    if a.fresh_noise:
        return fresh_noise()
    if a.alg is None or a.lr is None or a.dtype is None:
        ap.error("give ALG LR DTYPE (e.g. adam 0.02 bfloat16), or --table, or --fresh-noise")
    if a.ratio != "max" and a.alg != "lamb":
        ap.error("--ratio: 1-bit LAMB's scaling ratio (give lamb)")
    dtype = getattr(torch, a.dtype)
    name = "Adam" if a.alg == "adam" else "LAMB"
    one = run(a.alg, a.lr, dtype, baseline=False, refresh=a.refresh, bound=a.bound, seed=a.seed,
              log_every=25, ratio=a.ratio, layers=a.layers)
    base = run(a.alg, a.lr, dtype, baseline=True, seed=a.seed, log_every=25)
    if a.layers and a.alg == "lamb":
        print("step layer     r  LAMB ||x||/||u||  max frozen/fresh  |u| there / max |u|  "
              "u^2 share fresh<frozen  weighted ratio")
        for step, layers in one.layers:
            for k, d in layers.items():
                print(f"{step:4d} {k:4s} {d['r']:6.2f} {d['lamb']:16.3g} {d['q_max']:17.3g} {d['u_at_max']:20.2g} "
                      f"{d['mass_fresh_below']:23.2f} {d['weighted']:15.2f}")
    elif a.layers:
        print("step layer  coords Adam's denom > 2x  < 1/2x  update norm / Adam's (same momentum)")
        for step, layers in one.layers:
            for k, d in layers.items():
                print(f"{step:4d} {k:4s} {d['adam_above']:23d} {d['adam_below']:7d} {d['norm_ratio']:38.2f}")
    print(f"step  1-bit {name}: loss, max |m_hat|/denom, coords > 3.16   |   {name}: the same")
    for (s, l1, r1, c1), (_, l2, r2, c2) in zip(one.log, base.log):
        print(f"{s:4d}  {l1:10.4g} {r1:10.3g} {c1:5d}   |   {l2:10.4g} {r2:8.3g} {c2:5d}")
    print(f"final loss: 1-bit {name} {one.final:.4g}, {name} {base.final:.4g} ({one.final / base.final:.2f}x); "
          f"mean of the last {TAIL} steps: {one.tail:.4g}, {base.tail:.4g} ({one.tail / base.tail:.2f}x)")
    print(f"last 10 steps: 1-bit {name} " + " ".join(f"{x:.3g}" for x in one.last)
          + f" | {name} " + " ".join(f"{x:.3g}" for x in base.last))


if __name__ == "__main__":
    main()
