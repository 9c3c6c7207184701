"""Execute mode, pieces that need no process group: partition, stage modules,
data order, wire protocol header, measurement."""

from types import SimpleNamespace

import torch

from perfsim.models.registry import get_model_spec
from perfsim.partition import partition, partition_model, partition_weights
from perfsim.runtime.data import Order, dataset_for
from perfsim.runtime.measure import latency_in
from perfsim.runtime.models import build_stage, build_stages


def test_partition_is_contiguous_nonempty_and_balanced():
    assert partition_weights([1, 1, 1, 1], 2) == [(0, 2), (2, 4)]
    assert partition_weights([10, 1, 1, 1, 1, 10], 3) == [(0, 1), (1, 5), (5, 6)]
    for name in ("gpt2-tiny", "gpt2-small-byte", "digits-mlp", "gpt2"):
        spec = get_model_spec(name)
        n = len(spec.layers())
        for p in range(1, min(n, 6) + 1):
            ranges = partition_model(spec, p)
            assert ranges[0][0] == 0 and ranges[-1][1] == n
            assert all(a < b for a, b in ranges)
            assert all(ranges[i][1] == ranges[i + 1][0] for i in range(p - 1))
    # gpt2-tiny over 4 stages: embedding with the first block, the head with the last
    assert partition_model(get_model_spec("gpt2-tiny"), 4) == [(0, 2), (2, 3), (3, 4), (4, 6)]
    assert partition(get_model_spec("digits-mlp").layers(), 2, by="layers") == [(0, 2), (2, 4)]


def test_partition_rejects_more_stages_than_layers():
    import pytest

    from perfsim.errors import ConfigError

    with pytest.raises(ConfigError, match="pp=9"):
        partition_model(get_model_spec("digits-mlp"), 9)


def test_stages_compose_to_the_same_model_whatever_the_split():
    spec = get_model_spec("gpt2-tiny")
    x, _ = dataset_for(spec).get(torch.arange(3))
    outs = []
    for p in (1, 2, 4):
        h = x
        for stage in build_stages(spec, p, seed=5):
            h = stage(h)
        outs.append(h)
    assert outs[0].shape == (3, spec.seq_len, spec.vocab)
    torch.testing.assert_close(outs[0], outs[1])
    torch.testing.assert_close(outs[0], outs[2])
    last = build_stage(spec, 4, 3, seed=5)
    assert last.is_last and not last.is_first


def test_mlp_stage_params_match_spec():
    spec = get_model_spec("digits-mlp")
    stages = build_stages(spec, 2, seed=0)
    assert sum(p.numel() for s in stages for p in s.parameters()) == sum(l.params for l in spec.layers())


def test_data_is_real_and_order_resumable():
    text = dataset_for(get_model_spec("gpt2-tiny"))
    assert len(text) > 5000
    x, y = text.get(torch.tensor([7]))
    assert torch.equal(x[0, 1:], y[0, :-1])  # next-byte targets
    assert bytes(x[0].tolist()).isascii()
    digits = dataset_for(get_model_spec("digits-mlp"))
    assert len(digits) == 1797
    order = Order(len(digits), 32, seed=3)
    assert order.steps_per_epoch == 57  # ceil(1797 / 32): perfsim.job.steps_per_epoch, predict's count
    a = order.batch(60)
    assert torch.equal(a, Order(len(digits), 32, seed=3).batch(60))
    assert not torch.equal(a, order.batch(61))
    epoch0 = [order.batch(s) for s in range(57)]
    assert len(set(torch.cat(epoch0[:56]).tolist())) == 56 * 32  # no repeats before the last batch
    assert set(torch.cat(epoch0).tolist()) == set(range(1797))  # every sample visited each epoch
    last = epoch0[-1]  # the 5 left over, completed with the epoch's first 27 (DistributedSampler's padding)
    assert len(last) == 32 and len(set(last.tolist())) == 32
    assert torch.equal(last[5:], epoch0[0][:27])
    # the data sets' sizes are perfsim.models.datasets' (what predict counts an epoch over)
    from perfsim.models.datasets import dataset_samples

    for name, ds in (("gpt2-tiny", text), ("digits-mlp", digits)):
        assert dataset_samples(get_model_spec(name)) == len(ds)
        assert dataset_samples(get_model_spec(name), 100) == len(dataset_for(get_model_spec(name), 100)) == 100
    r0, r1 = order.replica_batch(5, 0, 2), order.replica_batch(5, 1, 2)
    assert torch.equal(torch.cat([r0, r1]), order.batch(5))


def test_resume_of_another_job_is_refused_before_launch(tmp_path):
    import json

    import pytest

    from perfsim.errors import ConfigError
    from perfsim.runtime import checkpoint
    from perfsim.runtime import make_config

    job = dict(model="digits-mlp", pp=2, micro_batch=8, schedule="1f1b")  # run's defaults before issue 38
    saved = json.loads(make_config(**job, out=str(tmp_path)).to_json())
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "latest.json").write_text(json.dumps(
        {"format": checkpoint.FORMAT, "version": checkpoint.VERSION, "step": 3, "world_size": 2,
         "config": saved}))
    make_config(**job, resume=str(tmp_path), steps=6)  # same job: fine
    with pytest.raises(ConfigError, match="compress"):
        make_config(**job, resume=str(tmp_path), compress="fp16")
    with pytest.raises(ConfigError, match="no checkpoint"):
        make_config(**job, resume=str(tmp_path / "nothing"))


def test_a_checkpoint_stored_with_text_values_resumes(tmp_path):
    """A run checkpointed before the job's values were parsed once stored device_order and
    partition as text: it resumes the same job, given again
    in either spelling, and refuses another."""
    import json

    import pytest

    from perfsim.errors import ConfigError
    from perfsim.runtime import checkpoint, make_config

    job = dict(model="digits-mlp", pp=2, micro_batch=8, schedule="1f1b")
    saved = json.loads(make_config(**job, device_order="1,0", partition="3,1", out=str(tmp_path)).to_json())
    assert saved["device_order"] == [1, 0] and saved["partition"] == [3, 1]
    saved.update(device_order="1,0", partition="3,1")  # the old spelling
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "latest.json").write_text(json.dumps(
        {"format": checkpoint.FORMAT, "version": checkpoint.VERSION, "step": 3, "world_size": 2,
         "config": saved}))
    cfg = make_config(resume=str(tmp_path), steps=6)
    assert (cfg.device_order, cfg.partition) == ((1, 0), (3, 1))
    assert make_config(**job, device_order=[1, 0], partition="3,1", resume=str(tmp_path), steps=6) == cfg
    with pytest.raises(ConfigError, match="--partition"):
        make_config(**job, partition="2,2", resume=str(tmp_path))


def test_digits_without_scikit_learn_says_which_extra(monkeypatch):
    """scikit-learn is optional (the ``digits`` extra): without it, one line naming it."""
    import sys

    import pytest

    from perfsim.errors import ConfigError
    from perfsim.runtime import data

    monkeypatch.setitem(sys.modules, "sklearn", None)  # not found, import raises ImportError
    data.digits_arrays.cache_clear()
    try:
        with pytest.raises(ConfigError, match=r"needs scikit-learn: pip install 'perfsim\[digits\]'"):
            data.digits_arrays()
    finally:
        data.digits_arrays.cache_clear()


def test_digits_are_scikit_learns_load_digits():
    """The digits read from scikit-learn's shipped file are ``load_digits()``'s, value
    for value (features / 16 as float32, labels as int64)."""
    import torch
    from sklearn.datasets import load_digits

    from perfsim.runtime import data

    data.digits_arrays.cache_clear()
    x, y = data.digits_arrays()
    d = load_digits()
    assert torch.equal(x, torch.tensor(d.data, dtype=torch.float32) / 16.0)
    assert torch.equal(y, torch.tensor(d.target, dtype=torch.int64))
    assert x.shape == (1797, 64) and float(x.max()) == 1.0 and sorted(set(y.tolist())) == list(range(10))


def test_a_run_records_who_made_its_emulated_latency(monkeypatch):
    """perfsim.runtime.measure.latency_in: the launcher tells the ranks to delay deliveries
    themselves only where the kernel has no sch_netem (perfsim.netem); validate reads it to
    decide the TCP window (perfsim.tcp)."""
    monkeypatch.delenv("PERFSIM_APP_LATENCY_S", raising=False)
    assert latency_in(SimpleNamespace(bandwidth_bps=None, latency_s=0.0)) == ""
    assert latency_in(SimpleNamespace(bandwidth_bps=1e8, latency_s=0.0)) == ""
    assert latency_in(SimpleNamespace(bandwidth_bps=1e8, latency_s=0.04)) == "kernel"
    monkeypatch.setenv("PERFSIM_APP_LATENCY_S", "0.04")
    assert latency_in(SimpleNamespace(bandwidth_bps=1e8, latency_s=0.04)) == "application"
