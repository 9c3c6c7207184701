"""Why 1-bit Adam / 1-bit LAMB can diverge after warm-up where Adam / LAMB train.

One process, exact averaging (``compressor="fp32"``, no 1-bit compression at all): the
compression stage's update ``m / (sqrt(v_frozen) + eps)`` with the variance frozen at the
end of warm-up (1-bit Adam, arXiv:2102.02888; 1-bit LAMB, arXiv:2104.06069 Alg. 1).
Data: scikit-learn digits standardised per pixel (``(x - mean) / (std + 1e-3)``), so
pixels that are almost always blank become rare inputs of 10-40 when they do light up;
MLP 64-64-10, batch 64, 300 steps, warm-up 100 (the library default). Prints, every 50
steps, the full-data loss and the largest ``|m| / denom`` of the first layer with the
input pixel it belongs to and that pixel's frozen variance, then the baseline's loss.

    python scripts/onebit_frozen_variance.py adam 0.02 bfloat16
    python scripts/onebit_frozen_variance.py lamb 0.1 float32
"""

from __future__ import annotations

import sys

import torch

from perfsim.runtime.data import digits_arrays
from perfsim.runtime.onebit_optim import OneBitAdam, OneBitLamb


def run(alg: str, lr: float, dtype, baseline: bool, log: bool) -> float:
    x_all, y_all = digits_arrays()
    x_all = x_all * 16.0
    x_all = (x_all - x_all.mean(0)) / (x_all.std(0) + 1e-3)
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).to(dtype)
    cls = OneBitAdam if alg == "adam" else OneBitLamb
    if baseline and alg == "adam":
        opt = torch.optim.Adam(m.parameters(), lr=lr)
    else:  # LAMB = 1-bit LAMB whose warm-up never ends
        opt = cls(m.parameters(), lr=lr, warmup=10**6 if baseline else 100, compressor="fp32")
    g = torch.Generator().manual_seed(5)
    loss = float("nan")
    for step in range(300):
        idx = torch.randint(0, len(x_all), (64,), generator=g)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(m(x_all[idx].to(dtype)).float(), y_all[idx]).backward()
        opt.step()
        if (step + 1) % 50 == 0:
            with torch.no_grad():
                loss = float(torch.nn.functional.cross_entropy(m(x_all.to(dtype)).float(), y_all))
            if log:
                st = opt.state[m[0].weight]
                v = st.get("exp_avg_sq_frozen", st["exp_avg_sq"]) / (1 - 0.999 ** min(step + 1, 100))
                r = st["exp_avg"].abs() / (v.sqrt() + 1e-8)
                i = int(r.argmax())
                print(f"step {step + 1}: loss {loss:.4g}  max |m|/denom {float(r.max()):.3g} at pixel {i % 64} "
                      f"(max |x| {float(x_all[:, i % 64].abs().max()):.3g}, frozen v {float(v.view(-1)[i]):.2g})")
    return loss


if __name__ == "__main__":
    alg, lr, dtype = sys.argv[1], float(sys.argv[2]), getattr(torch, sys.argv[3])
    torch.set_num_threads(1)
    run(alg, lr, dtype, baseline=False, log=True)
    print(f"baseline ({'Adam' if alg == 'adam' else 'LAMB'}) final loss {run(alg, lr, dtype, True, False):.4g}")
