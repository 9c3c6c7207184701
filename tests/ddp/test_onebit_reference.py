"""1-bit Adam / 1-bit LAMB step by step against a reference written from the papers'
equations, plus the state-dict round trip and bad input.

The reference (plain torch, one process) simulates the W workers of the compression
stage itself: every worker's error-compensated sign compression of the fused
momentum (1-bit LAMB, arXiv:2104.06069, Algorithm 1 lines 5-8), the server's average
and error-compensated re-compression of its chunk (lines 9-11, the 3-phase
compressed allreduce of Sec. 5), then the update of each layer: 1-bit Adam's frozen
preconditioner (Tang et al., arXiv:2102.02888) and 1-bit LAMB's reconstructed
gradient, fresh variance, clipped scaling ratio and frozen coefficient (lines 13-21)
with the momentum scaling of Sec. 4.3. perfsim's optimizers run on two real gloo
ranks; rank 0 gathers both ranks' local gradients, advances the reference and the
test compares the parameters after every step.
"""

from __future__ import annotations

import io
import math

import pytest
import torch

from perfsim.errors import ConfigError

from _helpers import gloo_group, run_ranks, same_state, save_rank

WORLD, STEPS, WARMUP, LR, WD = 2, 14, 4, 0.02, 0.01
B1, B2, EPS = 0.9, 0.999, 1e-8
CASES = [("onebit-adam", "preconditioned"), ("onebit-adam", "momentum"),
         ("onebit-lamb", "preconditioned"), ("onebit-lamb", "momentum")]


def _model(dtype=torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3)).to(dtype)


def _batch(step: int, rank: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(8, 6, generator=g)
    x[:, 0] = 0.0  # an input that is always 0: its weights never get a gradient (zero variance)
    return x, torch.randint(0, 3, (8,), generator=g)


# ----------------------------------------------------------------- the reference
def _ef_sign(x: torch.Tensor, err: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Error-compensated 1-bit compression: c = x + e, scale ||c||_2 / sqrt(n),
    Q = scale * sign(c) (sign(0) = +), e <- c - Q."""
    c = x + err
    scale = torch.linalg.vector_norm(c) / math.sqrt(c.numel())
    q = torch.where(c >= 0, scale, -scale)
    return q, c - q


class Reference:
    """The papers' algorithms for W simulated workers (global state is shared: every
    worker holds the same parameters, momentum and variance)."""

    def __init__(self, params: list[torch.Tensor], algorithm: str, exchange: str, world: int,
                 b3: float = 0.9, c_bounds=(0.01, 0.3), r_bounds=(0.5, 4.0), thr: float = 0.1):
        self.x = [p.detach().double().clone() for p in params]
        self.m = [torch.zeros_like(p) for p in self.x]
        self.v = [torch.zeros_like(p) for p in self.x]
        self.alg, self.exchange, self.world = algorithm, exchange, world
        self.b3, self.c_bounds, self.r_bounds, self.thr = b3, c_bounds, r_bounds, thr
        self.c_avg = [0.0] * len(self.x)
        self.t = 0
        self.worker_err = self.server_err = None

    def step(self, grads_per_worker: list[list[torch.Tensor]]) -> None:
        self.t += 1
        grads = [[g.double() for g in gs] for gs in grads_per_worker]
        if self.t <= WARMUP:
            self._warmup([sum(gs[i] for gs in grads) / self.world for i in range(len(self.x))])
            if self.t == WARMUP:
                self._freeze()
        else:
            self._compressed(grads)

    def _warmup(self, g: list[torch.Tensor]) -> None:
        t = self.t
        for i, x in enumerate(self.x):
            self.m[i] = B1 * self.m[i] + (1 - B1) * g[i]
            self.v[i] = B2 * self.v[i] + (1 - B2) * g[i] ** 2
            u = (self.m[i] / (1 - B1 ** t)) / ((self.v[i] / (1 - B2 ** t)).sqrt() + EPS)
            if self.alg == "onebit-adam":  # AdamW
                self.x[i] = x * (1 - LR * WD) - LR * u
            else:  # LAMB, eq. (2), clip on the whole ratio (footnote 4), c_avg with b3
                u = u + WD * x
                ratio = float(x.norm() / u.norm()) if x.norm() > 0 and u.norm() > 0 else 1.0
                c = min(max(ratio, self.c_bounds[0]), self.c_bounds[1])
                self.c_avg[i] = self.b3 * self.c_avg[i] + (1 - self.b3) * c
                self.x[i] = x - LR * c * u

    def _freeze(self) -> None:
        tw = self.t
        self.v_frozen = [v.clone() for v in self.v]
        self.denom = [(v / (1 - B2 ** tw)).sqrt() + EPS for v in self.v_frozen]
        self.c_frozen = [c / (1 - self.b3 ** tw) for c in self.c_avg]
        self.r_prev = [1.0] * len(self.x)
        rms = [float(m.norm()) / math.sqrt(m.numel()) for m in self.m]  # Sec. 4.3 momentum scale
        united = sum(r for r in rms if r > 0) / max(1, sum(r > 0 for r in rms))
        self.mscale = [united / r if r > 0 else 1.0 for r in rms]

    def _send(self, i: int, m_local: torch.Tensor) -> torch.Tensor:
        if self.exchange == "preconditioned":
            return m_local / self.denom[i]
        return m_local * self.mscale[i] if self.alg == "onebit-lamb" else m_local

    def _receive(self, i: int, avg: torch.Tensor) -> torch.Tensor:
        if self.exchange == "preconditioned":
            return avg * self.denom[i]
        return avg / self.mscale[i] if self.alg == "onebit-lamb" else avg

    def _compressed(self, grads: list[list[torch.Tensor]]) -> None:
        t, n_layers = self.t, len(self.x)
        dead = [v == 0 for v in self.v_frozen]  # never a gradient in warm-up: masked
        fused = []
        for gs in grads:  # lines 5-6 on every worker: local momentum, fused (Sec. 4.2)
            local = [(B1 * self.m[i] + (1 - B1) * gs[i]).masked_fill(dead[i], 0.0) for i in range(n_layers)]
            fused.append(torch.cat([self._send(i, local[i]).reshape(-1) for i in range(n_layers)]))
        n = fused[0].numel()
        chunk = 8 * -(-n // (8 * self.world))
        if self.worker_err is None:
            self.worker_err = [torch.zeros(chunk * self.world, dtype=torch.float64) for _ in fused]
            self.server_err = [torch.zeros(chunk, dtype=torch.float64) for _ in range(self.world)]
        sent = []
        for w, f in enumerate(fused):  # line 7: compress with the worker's error
            padded = torch.cat([f, f.new_zeros(chunk * self.world - n)])
            q, self.worker_err[w] = _ef_sign(padded, self.worker_err[w])
            sent.append(q)
        back = []
        for j in range(self.world):  # lines 9-10: server j averages chunk j, compresses it
            avg = sum(q[j * chunk:(j + 1) * chunk] for q in sent) / self.world
            q, self.server_err[j] = _ef_sign(avg, self.server_err[j])
            back.append(q)
        out = torch.cat(back)[:n]  # line 13
        at = 0
        for i, x in enumerate(self.x):
            k = x.numel()
            m_new = self._receive(i, out[at:at + k].view_as(x)).masked_fill(dead[i], 0.0)
            at += k
            if self.alg == "onebit-adam":
                self.m[i] = m_new
                self.x[i] = x * (1 - LR * WD) - LR * (m_new / (1 - B1 ** t)) / self.denom[i]
                continue
            g_rec = (m_new - B1 * self.m[i]) / (1 - B1)                       # line 15
            self.v[i] = B2 * self.v[i] + (1 - B2) * g_rec ** 2                 # line 16
            self.m[i] = m_new
            fresh = (self.v[i] / (1 - B2 ** t)).sqrt() + EPS
            r = float((self.denom[i] / fresh).max())                            # line 17
            r = min(max(r, self.r_bounds[0]), self.r_bounds[1])                 # line 18
            r = min(max(r, self.r_prev[i] * (1 - self.thr)), self.r_prev[i] * (1 + self.thr))  # line 19
            self.r_prev[i] = r
            u = (m_new / (1 - B1 ** t)) / self.denom[i] + WD * x
            self.x[i] = x - LR * self.c_frozen[i] * r * u                        # lines 20-21


# ----------------------------------------------------------------- two ranks
def _roundtrip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _local_grads(model, step, rank, dtype=torch.float32):
    x, y = _batch(step, rank)
    model.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(x.to(dtype)).float(), y).backward()


def _worker(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from perfsim.ddp import onebit_optimizer

    res: dict = {}
    with gloo_group(rank, WORLD, port):
        for alg, exchange in CASES:
            model = _model()
            ddp = DDP(model)
            opt = onebit_optimizer(ddp, f"{alg}:exchange={exchange}", LR, warmup=WARMUP, weight_decay=WD)
            ref = Reference(list(model.parameters()), alg, exchange, WORLD) if rank == 0 else None
            gaps = []
            for step in range(STEPS):
                _local_grads(ddp, step, rank)
                grads = [p.grad.detach().clone() for p in model.parameters()]
                everyone = [None] * WORLD
                dist.all_gather_object(everyone, grads)
                opt.step()
                if ref is not None:
                    ref.step(everyone)
                    gaps.append(max(float((p.detach().double() - q).abs().max() / (q.abs().max() + 1e-12))
                                    for p, q in zip(model.parameters(), ref.x)))
            res[(alg, exchange)] = gaps
        # state-dict round trip, bf16 and fp32 models: save at step 7 (after warm-up), resume
        # in fresh objects and compare with the uninterrupted run bit for bit
        for alg in ("onebit-adam", "onebit-lamb"):
            for dtype in (torch.float32, torch.bfloat16):
                runs = []
                for resume in (False, True):
                    model = _model(dtype)
                    opt = onebit_optimizer(DDP(model), alg, LR, warmup=WARMUP)
                    for step in range(STEPS):
                        if resume and step == 7:
                            saved = _roundtrip({"model": model.state_dict(), "opt": opt.state_dict()})
                            model = _model(dtype)
                            with torch.no_grad():
                                for p in model.parameters():
                                    p.add_(1.0)  # load must overwrite
                            model.load_state_dict(saved["model"])
                            opt = onebit_optimizer(DDP(model), alg, LR, warmup=WARMUP)
                            opt.load_state_dict(saved["opt"])
                            res[("state_dtypes", alg, str(dtype))] = sorted(
                                {str(v.dtype) for st in opt.state.values() for v in st.values()
                                 if isinstance(v, torch.Tensor) and v.is_floating_point()})
                            res[("err_equal", alg, str(dtype))] = all(
                                torch.equal(a, b) for a, b in zip(
                                    _errs(opt), _errs_saved(saved["opt"])))
                        _local_grads(model, step, rank, dtype)
                        opt.step()
                    runs.append(torch.cat([p.detach().float().reshape(-1) for p in model.parameters()]))
                res[("resume", alg, str(dtype))] = torch.equal(runs[0], runs[1])
        # bad input: a NaN gradient on rank 1 only, in the compression stage and in warm-up;
        # a finite gradient too large for the 1-bit scale (a diverged run) in the compression stage
        for stage_steps, bad in ((WARMUP + 2, float("nan")), (2, float("nan")), (WARMUP + 3, 1e22)):
            model = _model()
            opt = onebit_optimizer(DDP(model), "onebit-lamb", LR, warmup=WARMUP)
            for step in range(stage_steps):
                _local_grads(model, step, rank)
                opt.step()
            before = _roundtrip(opt.state_dict())
            params_before = [p.detach().clone() for p in model.parameters()]
            _local_grads(model, stage_steps, rank)
            if rank == 1:
                list(model.parameters())[2].grad[1, 3] = bad
                list(model.parameters())[2].grad[0, 3] = bad
            try:
                opt.step()
                msg = "no error"
            except ConfigError as exc:
                msg = str(exc)
            after = _roundtrip(opt.state_dict())
            unchanged = same_state(before, after) and all(
                torch.equal(p, q) for p, q in zip(params_before, model.parameters()))
            res[("nan", stage_steps)] = (msg, unchanged)
        save_rank(out_dir, rank, res)


def _errs(opt):
    comp = opt.compressor
    return [comp.worker_err[k] for k in sorted(comp.worker_err)] + [comp.server_err[k] for k in sorted(comp.server_err)]


def _errs_saved(sd):
    c = sd["onebit"]["compressor"]
    return [c["worker_err"][k] for k in sorted(c["worker_err"])] + [c["server_err"][k] for k in sorted(c["server_err"])]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_ranks(_worker, tmp_path_factory.mktemp("onebit_ref"), world=WORLD)


@pytest.mark.parametrize("alg,exchange", CASES)
def test_every_step_matches_the_papers_equations(ranks, alg, exchange):
    gaps = ranks[0][(alg, exchange)]
    assert len(gaps) == STEPS
    assert max(gaps) < 1e-5, [f"{g:.1e}" for g in gaps]  # float32 vs the float64 reference


@pytest.mark.parametrize("alg", ["onebit-adam", "onebit-lamb"])
@pytest.mark.parametrize("dtype", ["torch.float32", "torch.bfloat16"])
def test_resume_is_bit_identical_and_state_stays_float32(ranks, alg, dtype):
    for r in range(WORLD):
        res = ranks[r]
        assert res[("state_dtypes", alg, dtype)] == ["torch.float32"]
        assert res[("err_equal", alg, dtype)]
        assert res[("resume", alg, dtype)], f"{alg} {dtype}: resumed run differs on rank {r}"


def test_too_large_momentum_is_one_error_and_writes_nothing(ranks):
    msgs = [ranks[r][("nan", WARMUP + 3)] for r in range(WORLD)]
    assert all(unchanged for _, unchanged in msgs)
    assert msgs[0][0] == msgs[1][0], msgs  # the same error on every rank
    assert "values too large to encode (a norm beyond float32) on rank 1" in msgs[0][0], msgs
    assert f"at step {WARMUP + 4} (compression stage" in msgs[0][0], msgs


@pytest.mark.parametrize("stage", [WARMUP + 2, 2])
def test_nan_gradient_is_one_error_and_writes_nothing(ranks, stage):
    step = stage + 1
    for r in range(WORLD):
        msg, unchanged = ranks[r][("nan", stage)]
        assert f"step {step}" in msg and "NaN" in msg, msg
        assert unchanged, f"rank {r}: state or parameters changed by the refused step"
        # every rank names the step, the parameter group, the parameter and the rank alike
        assert msg == ranks[0][("nan", stage)][0]
        assert "NaN/Inf in parameter group 0, parameter 2.weight (3, 12) on rank 1 at step" in msg, msg


def test_bad_input_in_one_process():
    from perfsim.ddp import onebit_optimizer
    from perfsim.runtime.onebit_optim import OneBitAdam

    model = _model()
    with pytest.raises(ConfigError, match="not a 1-bit optimizer"):
        onebit_optimizer(model, "qsgd-maxnorm:4", 1e-3)
    with pytest.raises(ConfigError, match="compressor='qsgd-maxnorm:2' cannot exchange the momentum"):
        OneBitAdam(model.parameters(), compressor="qsgd-maxnorm:2")
    # a world-size change on resume: the error buffers are per rank
    opt = onebit_optimizer(model, "onebit-adam", 1e-3, warmup=1)
    sd = opt.state_dict()
    sd["onebit"]["world_size"] = 4
    sd["onebit"]["compressor"]["worker_err"] = {"ar8w4": torch.zeros(8)}
    fresh = onebit_optimizer(_model(), "onebit-adam", 1e-3, warmup=1)
    with pytest.raises(ConfigError, match="4 data-parallel ranks, this run has 1"):
        fresh.load_state_dict(sd)
    assert not fresh.state and fresh.global_state["step"] == 0  # nothing written
