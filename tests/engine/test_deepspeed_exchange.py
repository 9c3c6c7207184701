"""DeepSpeed's pipeline engine as perfsim orders it (``p2p_exchange="deepspeed"``,
perfsim.schedules.deepspeed_rows): the instructions of DeepSpeed's ``TrainSchedule`` step by step,
each pipeline message a blocking call, and its timing against a closed form."""

import pytest

import perfsim
from perfsim.config import Strategy, System, Workload
from perfsim.engine import simulate
from perfsim.errors import ConfigError
from perfsim.models.specs import LayerSpec
from perfsim.profile import Profile
from perfsim.schedules import deepspeed_rows, one_f_one_b


def _train_schedule(stage: int, stages: int, micro_batches: int) -> list[str]:
    """DeepSpeed's ``TrainSchedule.steps`` for one stage, transcribed apart from perfsim's: its four
    ``_*_step_*_id`` helpers as DeepSpeed writes them, the instruction names as text."""
    def even_fwd(step):
        return step // 2 - stage // 2

    def odd_fwd(step):
        return (step - 1) // 2 - stage // 2

    def even_bwd(step):
        return step // 2 - stages + (stage + 1) // 2

    def odd_bwd(step):
        return (step - 1) // 2 - stages + 1 + stage // 2

    def valid(mb):
        return 0 <= mb < micro_batches

    out, prev = [], -1
    for step in range(2 * (micro_batches + stages - 1)):
        if step % 2 == 0 and stage % 2 == 0:
            mb, fwd = even_fwd(step), True
        elif step % 2 == 1 and stage % 2 == 1:
            mb, fwd = odd_fwd(step), True
        elif step % 2 == 0:
            mb, fwd = even_bwd(step), False
        else:
            mb, fwd = odd_bwd(step), False
        if fwd:
            if valid(mb) and stage > 0:
                out.append(f"RecvActivation{mb}")
            if valid(prev) and stage > 0:
                out.append(f"SendGrad{prev}")
        else:
            if valid(prev) and stage < stages - 1:
                out.append(f"SendActivation{prev}")
            if valid(mb) and stage < stages - 1:
                out.append(f"RecvGrad{mb}")
        if valid(mb):
            out.append(f"{'ForwardPass' if fwd else 'BackwardPass'}{mb}")
        prev = mb
    return out


_NAMES = {"RECV_F": "RecvActivation", "SEND_B": "SendGrad", "SEND_F": "SendActivation", "RECV_B": "RecvGrad",
          "F": "ForwardPass", "B": "BackwardPass"}


@pytest.mark.parametrize("p,m", [(2, 1), (2, 5), (3, 4), (4, 2), (4, 8), (5, 3), (8, 32)])
def test_rows_are_deepspeeds_train_schedule(p, m):
    """Every device's row is its stage's TrainSchedule: the same instructions in the same order, each
    message alone in its blocking call, the compute in the 1F1B table's own actions."""
    table = one_f_one_b(p, m)
    rows = deepspeed_rows(table)
    for d in range(p):
        text = []
        for x in rows[d]:
            if isinstance(x, tuple):
                assert len(x) == 1  # one message per blocking call
                x = x[0]
            text.append(f"{_NAMES[x.kind]}{x.microbatch}")
        assert text == _train_schedule(d, p, m), d
        assert [a for a in rows[d] if not isinstance(a, tuple)] == list(table.rows[d])


def test_one_middle_stage_written_out():
    """Stage 1 of 3 with 4 micro-batches: each message goes one step after the compute that made it,
    after the blocking receive of that step (a hand-checked reading of TrainSchedule)."""
    text = " ".join(" ".join(map(str, x)) if isinstance(x, tuple) else str(x)
                    for x in deepspeed_rows(one_f_one_b(3, 4))[1])
    assert text == ("1RECV_F0 1F0 1SEND_F0 1RECV_F1 1F1 1SEND_F1 1RECV_B0 1B0 1RECV_F2 1SEND_B0 1F2 "
                    "1SEND_F2 1RECV_B1 1B1 1RECV_F3 1SEND_B1 1F3 1SEND_F3 1RECV_B2 1B2 1SEND_B2 1RECV_B3 1B3 "
                    "1SEND_B3")


def _toy(tf: float, tb: float, stages: int, numel: int) -> Workload:
    layers = tuple(LayerSpec(f"l{i}", 0, (numel,), 0.0) for i in range(stages))
    return Workload("toy", layers, (tf,) * stages, (tb,) * stages, 1)


@pytest.mark.parametrize("m", [1, 3, 8])
def test_two_stages_closed_form(m):
    """Two stages, forward ``f``, backward ``b``, each message ``x`` seconds: every activation and
    every gradient lies on the critical path, ``(m + 1)(f + b) + 2 m x``; asynchronous sends
    are never slower."""
    f, b, numel, bw = 0.010, 0.025, 50_000, 1e9
    x = 4 * numel * 8 / bw  # one fp32 boundary over the link
    common = dict(bandwidth_bps=bw, latency_s=0.0, nic_sharing=False, p2p_control_latency_s=0.0,
                  p2p_protocol="rendezvous")
    st = Strategy(pp=2, micro_batch=1, macro_batch=m, schedule="1f1b")
    ds = simulate(_toy(f, b, 2, numel), st, System(**common, p2p_exchange="deepspeed"), Profile()).summary
    free = simulate(_toy(f, b, 2, numel), st, System(**common), Profile()).summary
    assert ds["iteration_s"] == pytest.approx((m + 1) * (f + b) + 2 * m * x, rel=1e-9)
    assert free["iteration_s"] <= ds["iteration_s"] * (1 + 1e-12)
    assert ds["engine"] == "event loop" and ds["compute_s"] == pytest.approx(free["compute_s"])


def test_other_schedules_are_refused_in_one_line(capsys):
    """DeepSpeed's engine runs 1F1B only: another schedule is a ConfigError naming both, and the
    CLI's exit 2 without a traceback."""
    with pytest.raises(ConfigError, match="p2p_exchange deepspeed.*'gpipe'"):
        perfsim.predict(model="gpt2-small-byte", pp=2, schedule="gpipe", p2p_exchange="deepspeed")
    from perfsim.cli import main

    assert main(["predict", "--model", "gpt2-small-byte", "--pp", "2", "--schedule", "zb-h1",
                 "--p2p-exchange", "deepspeed"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "deepspeed" in err[0] and "Traceback" not in err[0]
