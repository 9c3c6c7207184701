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
"""

from __future__ import annotations

import argparse

import torch

from perfsim.compression.refresh import step_bound
from perfsim.runtime.data import digits_arrays
from perfsim.runtime.onebit_optim import OneBitAdam, OneBitLamb

STEPS, WARMUP, BATCH = 300, 100, 64


def standardised_digits() -> tuple[torch.Tensor, torch.Tensor]:
    x, y = digits_arrays()
    x = x * 16.0
    return (x - x.mean(0)) / (x.std(0) + 1e-3), y


def run(alg: str, lr: float, dtype, *, baseline: bool, refresh: int = 0, bound: str = "off",
        seed: int = 5, log_every: int = 0) -> tuple[float, list[tuple[int, float, float, int]]]:
    """Final full-data loss and, every ``log_every`` steps, ``(step, loss, max |m_hat|/denom
    of the first layer, coordinates above Adam's bound)``. The baseline is the same
    optimizer whose warm-up never ends (bit-identical to AdamW / our LAMB)."""
    x_all, y_all = standardised_digits()
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).to(dtype)
    cls = OneBitAdam if alg == "adam" else OneBitLamb
    opt = cls(m.parameters(), lr=lr, warmup=10**9 if baseline else WARMUP, compressor="fp32",
              refresh=refresh, bound=bound)
    g = torch.Generator().manual_seed(seed)
    loss, log = float("nan"), []
    for step in range(1, STEPS + 1):
        idx = torch.randint(0, len(x_all), (BATCH,), generator=g)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(m(x_all[idx].to(dtype)).float(), y_all[idx]).backward()
        try:
            opt.step()
        except Exception as e:  # a diverged run stops with perfsim's one-line error
            print(f"  step {step}: {e}")
            return float("inf"), log
        if log_every and step % log_every == 0 or step == STEPS:
            with torch.no_grad():
                loss = float(torch.nn.functional.cross_entropy(m(x_all.to(dtype)).float(), y_all))
            st = opt.state[m[0].weight]
            b1, b2 = opt.param_groups[0]["betas"]
            n = opt._variance_steps() if step > WARMUP and not baseline else step
            v = st.get("exp_avg_sq_frozen", st["exp_avg_sq"]) / (1 - b2 ** n)
            r = st["exp_avg"].abs() / (1 - b1 ** step) / (v.sqrt() + 1e-8)
            log.append((step, loss, float(r.max()), int((r > step_bound(b1, b2) * (1 + 1e-6)).sum())))
    return loss, log


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("alg", nargs="?", choices=["adam", "lamb"])
    ap.add_argument("lr", nargs="?", type=float)
    ap.add_argument("dtype", nargs="?", choices=["float32", "bfloat16"])
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--refresh", type=int, default=0)
    ap.add_argument("--bound", default="off")
    ap.add_argument("--seed", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.table:
        return table()
    if a.alg is None or a.lr is None or a.dtype is None:
        ap.error("give ALG LR DTYPE (e.g. adam 0.02 bfloat16), or --table")
    dtype = getattr(torch, a.dtype)
    name = "Adam" if a.alg == "adam" else "LAMB"
    loss, log = run(a.alg, a.lr, dtype, baseline=False, refresh=a.refresh, bound=a.bound, seed=a.seed,
                    log_every=25)
    base, blog = run(a.alg, a.lr, dtype, baseline=True, seed=a.seed, log_every=25)
    print(f"step  1-bit {name}: loss, max |m_hat|/denom, coords > 3.16   |   {name}: the same")
    for (s, l1, r1, c1), (_, l2, r2, c2) in zip(log, blog):
        print(f"{s:4d}  {l1:10.4g} {r1:10.3g} {c1:5d}   |   {l2:10.4g} {r2:8.3g} {c2:5d}")
    print(f"final loss: 1-bit {name} {loss:.4g}, {name} {base:.4g} ({loss / base:.2f}x)")


if __name__ == "__main__":
    main()
