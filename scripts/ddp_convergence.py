"""Convergence of every perfsim.ddp method against fp32 on the same budget.

A real 2-rank gloo job (run it under torchrun, or let this script start one):
an MLP (64-64-10) on scikit-learn's digits, 32 samples per rank and step, the
same initial weights and data order for every configuration. Gradient
compressors run with Adam (lr 3e-3) and with SGD (momentum 0.9, lr 0.1), each
against plain fp32 DDP with the same optimizer; the 1-bit optimizers at lr 1e-2
and 1e-3 against their uncompressed counterparts (Adam; LAMB = 1-bit LAMB whose
warm-up never ends), with warm-up = 20 % of the steps (the papers' 15-20 %).
The figure of merit is the full-data loss after the last step divided by the
baseline's (tests/ddp/test_ddp_convergence.py requires <= 2).

    python scripts/ddp_convergence.py --steps 150 --out docs/ddp   # CSVs + docs/ddp/loss_curves.png

Writes ``<out>/ddp_convergence.csv`` (config, optimizer, lr, method, baseline,
final_loss, baseline_loss, ratio, wire_fraction: bytes each rank fed to collectives per
step -- the hook's / optimizer's ``wire_bytes`` -- over fp32 DDP's) and
``<out>/ddp_curves.csv`` (config, step, loss). ``--methods "SPEC SPEC ..."`` replaces the
gradient compressors (the bytes-vs-loss table per bit width in docs/ddp.md);
``--onebit-options "refresh=16 ..."`` adds 1-bit optimizer variants (``onebit-adam:refresh=16``).
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
from pathlib import Path

GRAD_METHODS = ["fp16", "bf16", "qsgd-maxnorm:4", "qsgd-maxnorm:2", "qsgd-maxnorm-multiscale:4", "ecq:4",
                "qsgd:4", "powersgd:2", "randk-maxnorm:0.25:4"]
OPT_LRS = (1e-2, 1e-3)


def configs(steps: int, methods: list[str] | None = None, onebit: bool = True,
            variants: tuple[str, ...] = ()) -> list[dict]:
    """Every (config, baseline) pair; a config's ``baseline`` names another config.
    ``methods``: the gradient compressors (default :data:`GRAD_METHODS`);
    ``onebit=False`` leaves out the 1-bit optimizers; ``variants``: 1-bit spec options
    (``refresh=16:bound=adam``) run as well, as ``onebit-adam:OPTIONS@LR``."""
    out = []
    for optim, lr in (("adam", 3e-3), ("sgd", 0.1)):
        base = f"{optim}/fp32"
        out.append({"config": base, "optim": optim, "lr": lr, "method": "fp32", "baseline": base})
        out += [{"config": f"{optim}/{m}", "optim": optim, "lr": lr, "method": m, "baseline": base}
                for m in (GRAD_METHODS if methods is None else methods)]
    for lr in OPT_LRS if onebit else ():
        adam = f"adam@{lr:g}/fp32"
        out.append({"config": adam, "optim": "adam", "lr": lr, "method": "fp32", "baseline": adam})
        out.append({"config": f"onebit-adam@{lr:g}", "optim": "onebit-adam", "lr": lr,
                    "method": "onebit-adam", "baseline": adam, "warmup": max(1, steps // 5)})
        lamb = f"lamb@{lr:g}/fp32"
        out.append({"config": lamb, "optim": "onebit-lamb", "lr": lr, "method": "onebit-lamb",
                    "baseline": lamb, "warmup": steps})  # warm-up all along: LAMB, fp32 allreduce
        out.append({"config": f"onebit-lamb@{lr:g}", "optim": "onebit-lamb", "lr": lr,
                    "method": "onebit-lamb", "baseline": lamb, "warmup": max(1, steps // 5)})
        for opts in variants:
            for name, base in (("onebit-adam", adam), ("onebit-lamb", lamb)):
                out.append({"config": f"{name}:{opts}@{lr:g}", "optim": name, "lr": lr,
                            "method": f"{name}:{opts}", "baseline": base, "warmup": max(1, steps // 5)})
    return out


def train_all(steps: int, only: list[str] | None, cfgs: list[dict]) -> tuple[dict, dict]:
    """Body of one rank (process group initialised): config -> [(step, full-data loss)],
    and config -> bytes this rank fed to collectives per step (the hook's or the
    1-bit optimizer's ``wire_bytes`` counter)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from perfsim import ddp as pddp
    from perfsim.runtime.data import digits_arrays

    x_all, y_all = digits_arrays()
    rank, world = dist.get_rank(), dist.get_world_size()
    curves, sent = {}, {}
    wanted = set(only or []) | {c["baseline"] for c in cfgs if c["config"] in (only or [])}
    for cfg in cfgs:
        if only and cfg["config"] not in wanted:
            continue
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
        model = DDP(net)
        if cfg["optim"].startswith("onebit"):
            opt = counter = pddp.onebit_optimizer(model, cfg["method"], lr=cfg["lr"], warmup=cfg["warmup"])
        else:
            counter = pddp.attach(model, cfg["method"], seed=1)
            opt = (torch.optim.Adam(model.parameters(), lr=cfg["lr"]) if cfg["optim"] == "adam"
                   else torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=0.9))
        g = torch.Generator().manual_seed(5)
        curve = []
        for step in range(steps):
            idx = torch.randint(0, len(x_all), (32 * world,), generator=g)[rank::world]
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x_all[idx]), y_all[idx]).backward()
            opt.step()
            if (step + 1) % 10 == 0 or step == steps - 1:
                with torch.no_grad():
                    curve.append((step + 1, float(torch.nn.functional.cross_entropy(net(x_all), y_all))))
        curves[cfg["config"]] = curve
        sent[cfg["config"]] = counter.wire_bytes / steps
    return curves, sent


def table(curves: dict, sent: dict, cfgs: list[dict]) -> list[dict]:
    """One row per config: final loss against its baseline's, and bytes per step as a
    fraction of fp32 DDP's (``wire_fraction``)."""
    rows = []
    fp32 = sent.get("adam/fp32") or sent.get("sgd/fp32")
    for cfg in cfgs:
        if cfg["config"] not in curves or cfg["baseline"] not in curves:
            continue
        final, base = curves[cfg["config"]][-1][1], curves[cfg["baseline"]][-1][1]
        rows.append({"config": cfg["config"], "optimizer": cfg["optim"], "lr": cfg["lr"],
                     "method": cfg["method"], "baseline": cfg["baseline"], "final_loss": final,
                     "baseline_loss": base, "ratio": final / base,
                     "wire_fraction": sent[cfg["config"]] / fp32 if fp32 else float("nan")})
    return rows


def write(out: Path, curves: dict, sent: dict, cfgs: list[dict], plot: bool) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    rows = table(curves, sent, cfgs)
    with open(out / "ddp_convergence.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    with open(out / "ddp_curves.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["config", "step", "loss"])
        for name, curve in curves.items():
            w.writerows([name, s, f"{v:.6g}"] for s, v in curve)
    if plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        groups = [("adam", "Adam, lr 3e-3"), ("sgd", "SGD momentum, lr 0.1"), ("@0.01", "1-bit, lr 1e-2"),
                  ("@0.001", "1-bit, lr 1e-3")]
        fig, axes = plt.subplots(1, 4, figsize=(20, 4.5), sharey=True)
        for ax, (key, title) in zip(axes, groups):
            for name, curve in curves.items():
                if (name.startswith(key + "/") if "@" not in key else key in name):
                    ax.plot([s for s, _ in curve], [v for _, v in curve], label=name.split("/")[-1]
                            if "@" not in key else name, lw=2.5 if "fp32" in name else 1.2)
            ax.set_title(title)
            ax.set_xlabel("step")
            ax.set_yscale("log")
            ax.legend(fontsize=7)
        axes[0].set_ylabel("full-data cross-entropy")
        fig.tight_layout()
        fig.savefig(out / "ddp_loss_curves.png", dpi=90)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--out", default="docs/ddp")
    ap.add_argument("--only", default="", help="comma list of configs (and their baselines)")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--methods", default="", help="gradient compressor specs separated by spaces "
                    "(default: the standard list); --no-onebit leaves out the 1-bit optimizers")
    ap.add_argument("--no-onebit", action="store_true")
    ap.add_argument("--onebit-options", default="", help="1-bit spec options separated by spaces, each "
                    "also run (e.g. 'refresh=16 refresh=16:bound=adam')")
    args = ap.parse_args(argv)
    only = [c for c in args.only.split(",") if c]
    cfgs = configs(args.steps, args.methods.split() or None, not args.no_onebit,
                   tuple(args.onebit_options.split()))
    if "RANK" not in os.environ:  # start the 2-rank job: this script under torchrun
        # --standalone: torchrun serves the store on localhost:0, bound as it is picked
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               __file__, *(argv if argv is not None else sys.argv[1:])]
        return subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1")).returncode
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    curves, sent = train_all(args.steps, only, cfgs)
    if dist.get_rank() == 0:
        for r in write(Path(args.out), curves, sent, cfgs, not args.no_plot):
            print(f"{r['config']:36s} {r['final_loss']:.4f}  {r['ratio']:.2f}x {r['baseline']}  "
                  f"bytes {r['wire_fraction']:.3f} of fp32")
    dist.barrier()  # both ranks done before gloo is torn down (else it can abort at exit)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    if "RANK" in os.environ:  # a finished torchrun rank (seen aborting at exit under load)
        from perfsim.procs import exit_rank

        exit_rank(code)
    sys.exit(code)
