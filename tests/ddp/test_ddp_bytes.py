"""`perfsim predict` prices exactly the gradient-sync bytes perfsim.ddp sends.

A real 2-rank gloo job trains the ``digits-mlp`` model (the registry's, so predict
and the job hold the same parameters) with each method through perfsim.ddp -- the
comm hook for gradient compressors, ``onebit_optimizer`` for 1-bit Adam -- while
``torch.distributed``'s collectives are wrapped to record every call the method
makes (kind and buffer bytes). Checked per method, for a steady-state step:

* the hook's / optimizer's own counter (``wire_bytes``) equals the recorded buffers;
* ``perfsim predict --pp 1 --dp 2 --grad-compress SPEC``'s ``dp_bytes`` (all ranks'
  bytes on the wire per iteration, ring collectives) equals the recorded calls
  priced by the simulator's collective model (:func:`perfsim.collectives.plan`).
"""

from __future__ import annotations

import pytest
import torch

from _helpers import gloo_group, run_ranks, save_rank

WORLD, STEPS = 2, 4
SPECS = ["fp32", "fp16", "qsgd-maxnorm:2", "qsgd-maxnorm:4", "qsgd-maxnorm-multiscale:4", "ecq:4",
         "randk-maxnorm:0.25:4", "powersgd:2", "onebit-adam", "onebit-lamb"]


def _record(calls: list):
    """Wrap the collectives the compressors call; every call appends (kind, bytes)."""
    import torch.distributed as dist

    def wrap(name, kind, size):
        orig = getattr(dist, name)

        def inner(*args, **kwargs):
            calls.append((kind, size(*args)))
            return orig(*args, **kwargs)
        setattr(dist, name, inner)

    nb = lambda t: t.numel() * t.element_size()  # noqa: E731
    wrap("all_reduce", "allreduce", lambda t, *a: nb(t))
    wrap("all_gather", "allgather", lambda parts, t, *a: nb(t))
    wrap("all_to_all_single", "alltoall", lambda out, t, *a: nb(t))


def _worker(rank: int, port: int, out_dir: str) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from perfsim import ddp as pddp
    from perfsim.models import get_model_spec
    from perfsim.runtime.models import build_stages

    spec_model = get_model_spec("digits-mlp")
    res = {}
    with gloo_group(rank, WORLD, port):
        for spec in SPECS:
            net = build_stages(spec_model, 1, seed=0)[0]
            model = DDP(net)
            if spec.startswith("onebit"):
                opt = counter = pddp.onebit_optimizer(model, spec, 1e-3, warmup=STEPS - 1)
            else:
                counter = pddp.attach(model, spec)
                opt = torch.optim.SGD(model.parameters(), lr=0.01)
            calls: list = []
            for step in range(STEPS):
                g = torch.Generator().manual_seed(10 * step + rank)
                x, y = torch.rand(16, 64, generator=g), torch.randint(0, 10, (16,), generator=g)
                opt.zero_grad(set_to_none=True)
                before = counter.wire_bytes
                if step == STEPS - 1:  # the steady state (compressing; PowerSGD past its start)
                    import torch.distributed as dist

                    saved = {n: getattr(dist, n) for n in ("all_reduce", "all_gather", "all_to_all_single")}
                    _record(calls)
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                if step == STEPS - 1:
                    for n, f in saved.items():
                        setattr(dist, n, f)
                    res[spec] = {"counted": counter.wire_bytes - before, "calls": list(calls),
                                 "params": sum(p.numel() for p in net.parameters())}
        save_rank(out_dir, rank, res)


@pytest.fixture(scope="module")
def sent(tmp_path_factory):
    return run_ranks(_worker, tmp_path_factory.mktemp("ddp_bytes"), world=WORLD)


@pytest.mark.parametrize("spec", SPECS)
def test_predict_prices_the_bytes_the_hook_sends(sent, spec):
    from perfsim import api
    from perfsim.collectives import GroupShape, plan

    for rank in range(WORLD):
        rec = sent[rank][spec]
        assert rec["calls"], spec
        assert rec["counted"] == sum(b for _, b in rec["calls"]), (spec, rec)  # the counter is honest
    g = GroupShape(n=WORLD, nodes=WORLD, per_node=1, intra_bps=1e9, intra_latency_s=0.0, inter_bps=1e9,
                   inter_latency_s=0.0)
    on_wire = sum(plan(kind, b, g, "ring").wire_bytes for kind, b in sent[0][spec]["calls"])
    r = api.predict(model="digits-mlp", pp=1, dp=WORLD, grad_compress=spec, collective_algo="ring")
    summary = r.summary if hasattr(r, "summary") else r
    assert summary["params"] == sent[0][spec]["params"]
    assert summary["dp_bytes"] == pytest.approx(WORLD * on_wire, rel=0, abs=0.5), (spec, sent[0][spec]["calls"])
