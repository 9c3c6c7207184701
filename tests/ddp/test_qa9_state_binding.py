"""How a CompressionState binds to its DDP model (qa9): ``perfsim.ddp.attach`` takes the model's
bucket cap, as the hook registered the torch way does; one state serves one model; a loaded
state must be for this model's buckets.

docs/ddp.md gives ``model.register_comm_hook(state, pddp.hook)`` and ``pddp.attach(model, spec)``
as equivalent; attach kept the 25 MiB default whatever ``bucket_cap_mb`` the model had, so
its canonical buckets (compressed layout, norms, bytes, how long the hook holds gradients
back) were not the DDP model's, nor what ``perfsim predict --bucket-size`` prices."""

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from perfsim import ddp as pddp

from _helpers import gloo_group

CAP_MB = 0.002  # 2097 bytes: (b2, W2) and (b1, W1) of a 64-64-10 MLP, two buckets


def _mlp(**kw):
    torch.manual_seed(0)
    return DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)), **kw)


def _layout(state):
    names = {id(p): n for n, p in state._named}
    return state.bucket_cap_bytes, [[names[id(p)] for p in g] for g in state.groups()]


def test_attach_bind_and_the_hook_share_the_models_buckets():
    with gloo_group(0, 1):
        hooked = _mlp(bucket_cap_mb=CAP_MB)
        state = pddp.CompressionState("qsgd-maxnorm:4")
        hooked.register_comm_hook(state, pddp.hook)
        hooked(torch.rand(4, 64)).sum().backward()  # the hook binds itself on its first call
        expected = (hooked.bucket_bytes_cap, [["2.bias", "2.weight"], ["0.bias", "0.weight"]])
        assert _layout(state) == expected
        attached = pddp.attach(_mlp(bucket_cap_mb=CAP_MB), "qsgd-maxnorm:4")
        assert _layout(attached) == expected
        bound = pddp.CompressionState("ecq:4").bind(_mlp(bucket_cap_mb=CAP_MB))
        assert _layout(bound) == expected
        default = pddp.attach(_mlp(), "ecq:4")  # DDP's default 25 MiB: one bucket
        assert _layout(default) == (25 * 2**20, [["2.bias", "2.weight", "0.bias", "0.weight"]])


def test_one_state_on_two_models_is_one_error_not_a_hang():
    """The second model's buckets waited for canonical buckets of the first: DDP never got their
    futures and two gloo ranks hung in backward() (qa9); now every rank raises the same line."""
    import pytest

    from perfsim.errors import ConfigError

    with gloo_group(0, 1):
        torch.manual_seed(0)
        a, b = DDP(torch.nn.Linear(16, 4)), DDP(torch.nn.Linear(16, 3))
        state = pddp.attach(a, "qsgd-maxnorm:4")
        b.register_comm_hook(state, pddp.hook)
        x = torch.rand(8, 16)
        a(x).sum().backward()  # its own model: fine
        with pytest.raises(ConfigError, match=r"bound to another model \(parameters weight, bias, \.\.\.\) than "
                                              r"this bucket's \(a \(3(, 16)?\) parameter\); create one "
                                              "CompressionState per DDP model") as e:
            b(x).sum().backward()
        assert "\n" not in str(e.value)


def _trained_state(spec="ecq:4"):
    """The state_dict of a state whose every canonical bucket has its compressor (as after a
    step over 2 ranks), bound to ``_mlp()``."""
    state = pddp.attach(_mlp(), spec)
    for i, g in enumerate(state.groups()):
        state.compressor(state.key_for(i, g, sum(p.numel() for p in g)))
    return state.state_dict()


def test_a_checkpoint_of_other_buckets_is_refused_not_silently_dropped():
    """Loading a state saved for other buckets kept its error feedback under keys no bucket
    used: the resumed run started afresh without a word (qa9). Renamed parameters (a wrapper,
    torch.compile's '_orig_mod.') and another bucket cap are refused at the first step."""
    import pytest

    from perfsim.errors import ConfigError

    with gloo_group(0, 1):
        saved = _trained_state()
        same = _mlp()
        state = pddp.attach(same, "ecq:4")
        state.load_state_dict(saved)
        same(torch.rand(4, 64)).sum().backward()  # the same model: resumes
        torch.manual_seed(0)
        wrapped = DDP(torch.nn.Sequential(_mlp().module))  # parameter names 0.0.weight ...
        for model in (wrapped, _mlp(bucket_cap_mb=CAP_MB)):
            state = pddp.CompressionState("ecq:4")
            model.register_comm_hook(state, pddp.hook)
            state.load_state_dict(saved)  # before the hook has seen the model: checked at its first call
            with pytest.raises(ConfigError, match=r"the checkpoint's bucket '2\.bias\.\.0\.weight:4810' is not "
                                                  r"one of this model's \('.*'\): parameter names") as e:
                model(torch.rand(4, 64)).sum().backward()
            assert "\n" not in str(e.value)
