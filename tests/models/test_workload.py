"""Workload presets, workload files, partitions."""

import pytest

from perfsim.errors import ConfigError
from perfsim.profile import Profile
from perfsim.engine import compute
from perfsim.engine.layer_times import layer_times
from perfsim.workload import get_model, load_workload_file, partition


@pytest.mark.parametrize("name,params,tol", [
    ("gpt2-xl", 1.558e9, 0.01),         # 1.5B (GPT-2 paper; nanoGPT count, tied head)
    ("bert-large", 335e6, 0.02),        # Devlin et al. 2019
    ("deberta-v2-xxlarge", 1.5e9, 0.06),
    ("resnet50", 25.56e6, 0.01),        # He et al. 2016 / torchvision
    ("vgg16", 138.36e6, 0.001),         # torchvision vgg16
])
def test_preset_sizes(name, params, tol):
    assert get_model(name).params == pytest.approx(params, rel=tol)


def test_unknown_preset():
    with pytest.raises(ConfigError, match="gpt5"):
        get_model("gpt5")


def _unfolded(tmp_path) -> Profile:
    """The default profile with its embed / head records no longer marked ``folded``: 0 s
    records that are not measurements."""
    import json

    from perfsim.profile.format import default_profile_path

    data = json.loads(default_profile_path().read_text())
    for r in data["records"]:
        r.pop("folded", None)
    path = tmp_path / "unfolded.json"
    path.write_text(json.dumps(data))
    return Profile.load(path)


def test_default_partition_is_the_papers_and_an_unfolded_head_takes_room(tmp_path):
    # the default profile folds embed / head into the paper's equal stages: 6 blocks each
    m = get_model("gpt2-xl")
    fwd, bwd = layer_times(m, Profile.default(), 1)
    assert fwd[0] == fwd[-1] == bwd[-1] == 0.0
    bounds = partition([f + b for f, b in zip(fwd, bwd)], 8)
    assert [b - a for a, b in bounds] == [7, 6, 6, 6, 6, 6, 6, 7]
    # a 0 s record without the fact is no measurement: the LM head (1600 x 50257 per token,
    # charged from its FLOPs at the profile's rate) takes the last stage's room
    fwd, bwd = layer_times(m, _unfolded(tmp_path), 1)
    bounds = partition([f + b for f, b in zip(fwd, bwd)], 8)
    blocks = [sum(1 for i in range(a, b) if m.layers[i].name.startswith("block")) for a, b in bounds]
    assert sum(blocks) == 48 and blocks[-1] < 6 and max(blocks) <= 7
    assert bounds[0][0] == 0 and bounds[-1][1] == len(m.layers)


def test_partition_minimises_slowest_stage():
    costs = [5, 1, 1, 1, 1, 1, 5]
    bounds = partition(costs, 3)
    worst = max(sum(costs[a:b]) for a, b in bounds)
    assert worst == 5 and bounds == [(0, 1), (1, 6), (6, 7)]
    assert [b - a for a, b in partition([1.0] * 6, 3)] == [2, 2, 2]


@pytest.mark.parametrize("explicit", [(1, 2), (0, 3, 4), (2, 2, 2)])
def test_explicit_partition_must_fit(explicit):
    with pytest.raises(ConfigError, match="partition"):
        partition([1.0] * 7, 3, explicit)
    assert partition([1.0] * 7, 3, (3, 2, 2)) == [(0, 3), (3, 5), (5, 7)]


def test_too_many_stages():
    with pytest.raises(ConfigError, match="pp=9"):
        partition([1.0] * 8, 9)


def test_flops_fallback_uses_profile_rate():
    m = get_model("bert-large")
    prof = Profile.default()
    fwd, bwd = layer_times(m, prof, 2)
    assert fwd[1] == pytest.approx(2 * m.layers[1].flops_fwd / prof.effective_flops()
                                   + compute.layer_bytes(m.arch, "block1", 2, 4) / 900e9)
    assert bwd[1] == pytest.approx(2 * fwd[1])
    with pytest.raises(ConfigError, match="no compute time"):
        layer_times(m, Profile(), 1)


def test_workload_file_toml(write_file):
    f = write_file("w.toml", 'name = "mine"\ntokens_per_sample = 16\n'
                             '[[layers]]\nname = "blk"\ncount = 3\nparams = 100\nout_shape = [16, 4]\nfwd_s = 0.001\n'
                             '[[layers]]\nname = "head"\nparams = 10\nout_shape = [2]\nfwd_s = 0.002\nbwd_s = 0.001\n')
    m = load_workload_file(f)
    assert [layer.name for layer in m.layers] == ["blk0", "blk1", "blk2", "head"]
    fwd, bwd = layer_times(m, Profile(), 4)
    assert fwd == pytest.approx([0.004] * 3 + [0.008]) and bwd == pytest.approx([0.008] * 3 + [0.004])


@pytest.mark.parametrize("text,msg", [
    ("layers = []", "non-empty"),
    ('[[layers]]\nparams = 1\n', "out_shape"),
    ('[[layers]]\nparams = -1\nout_shape = [1]\n', "params"),
    ('[[layers]]\nparams = 1\nout_shape = [1]\ncolour = 2\n', "colour"),
    ('nme = "x"\n[[layers]]\nparams = 1\nout_shape = [1]\n', "nme"),
    ("[[layers", "malformed"),
])
def test_bad_workload_files(write_file, text, msg):
    f = write_file("w.toml", text)
    with pytest.raises(ConfigError, match=msg):
        load_workload_file(f)


def test_layer_without_times_or_flops_is_an_error(write_file):
    """Such a layer was silently free."""
    f = write_file("w.toml", '[[layers]]\nname = "a"\nparams = 1\nout_shape = [1]\nfwd_s = 0.001\n'
                             '[[layers]]\nname = "free"\nparams = 1\nout_shape = [1]\n')
    with pytest.raises(ConfigError, match=r"layers\[1\] \('free'\) has neither fwd_s nor flops"):
        load_workload_file(f)
    f.write_text('[[layers]]\nname = "free"\nparams = 1\nout_shape = [1]\nflops = 0\n')
    assert load_workload_file(f).layers[0].flops_fwd == 0.0  # free on purpose


def test_workload_times_take_units(write_file):
    """`fwd_s = "5ms"` was refused ("must be a number >= 0") although every time flag takes
    units: a time written as text goes through the one units parser (a TOML/JSON number is
    seconds, as the key says); text without a unit, a bad unit or a negative time is refused
    naming the field."""
    layer = '[[layers]]\nname = "a"\nparams = 1\nout_shape = [1]\n'
    f = write_file("w.toml", layer + 'fwd_s = "5ms"\nbwd_s = "12000us"\n')
    m = load_workload_file(f)
    assert m.fwd_s == pytest.approx((0.005,)) and m.bwd_s == pytest.approx((0.012,))
    f = write_file("w.toml", layer + 'fwd_s = "5ms"\n')
    assert load_workload_file(f).bwd_s == pytest.approx((0.010,))  # 2 x fwd_s, as for a number
    j = write_file("w.json", '{"layers": [{"params": 1, "out_shape": [1], "fwd_s": "0.5 s"}]}')
    assert load_workload_file(j).fwd_s == pytest.approx((0.5,))
    for bad, msg in (('"5"', "needs a unit"), ('"5 furlongs"', "unknown unit"), ('"-5ms"', ">= 0"),
                     ("true", "number")):
        f = write_file("w.toml", layer + f"fwd_s = {bad}\n")
        with pytest.raises(ConfigError, match=r"layers\[0\]\.fwd_s") as err:
            load_workload_file(f)
        assert msg in str(err.value)
    f = write_file("w.toml", layer + 'fwd_s = 0.001\nflops = "5ms"\n')
    with pytest.raises(ConfigError, match=r"layers\[0\]\.flops"):  # not a time: numbers only
        load_workload_file(f)
