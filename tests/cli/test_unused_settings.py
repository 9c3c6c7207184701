"""Settings given but not used by the configuration: accepted (the planner, grids and the
blind checks' interface pass them), and said -- in ``model_note`` (as ``a2a_compress`` with
ep 1 is) and once on stderr -- only when the caller set them (qa1 F11 and "flags accepted
but with no effect")."""

import perfsim
from perfsim.api import predict as api_predict, unused_notes

from _helpers import run_cli_here

#: figures a setting with no effect leaves unchanged
FIGURES = ("iteration_s", "peak_memory_gib", "dp_bytes", "pipeline_bytes", "tied_bytes", "comm_s", "optimizer_s")
MLP = {"model": "digits-mlp", "pp": 2}


def _figures(summary):
    return {k: summary.get(k) for k in FIGURES}


def test_a_bandwidth_beside_nics_is_said_unused():
    """qa1 F11: --nic 2x1Gbps --bandwidth 100Mbps predicted at 2 Gbps, the 100 Mbps ignored
    without a word. Now the summary and stderr say so; the prediction is --nic's."""
    both = perfsim.predict(nic="2x1Gbps", bandwidth="100Mbps", **MLP, dp=2).summary
    nic = perfsim.predict(nic="2x1Gbps", **MLP, dp=2).summary
    assert _figures(both) == _figures(nic)
    assert unused_notes(both) == ["bandwidth 100Mbps unused: nic 2x1Gbps gives each node's links"]
    assert "model_note" not in nic
    # the planner's and a sweep's configurations carry it too: the user gave both
    assert unused_notes(api_predict(nic="2x1Gbps", bandwidth="100Mbps", **MLP).summary) == unused_notes(both)
    fabric = dict(model="gpt2-tiny", gpu="h100", pp=1, dp=2, gpus_per_node=2, intra_node_fabric="nvlink4")
    s = perfsim.predict(**fabric, intra_node_bandwidth="1GB/s").summary
    assert _figures(s) == _figures(perfsim.predict(**fabric).summary)
    assert "intra_node_bandwidth 8Gbps unused: intra_node_fabric nvlink4 gives the intra-node links" \
        in unused_notes(s)


def test_predict_sweep_and_plan_say_it_once_on_stderr(tmp_path):
    note = "note: bandwidth 100Mbps unused: nic 2x1Gbps gives each node's links"
    r = run_cli_here("predict", "--model", "digits-mlp", "--pp", "2", "--nic", "2x1Gbps", "--bandwidth", "100Mbps",
                     "--compress", "fp32,fp16", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines().count(note) == 1 and "bandwidth 100Mbps unused" in r.stdout
    r = run_cli_here("sweep", "--model", "digits-mlp", "--pp", "2", "--nic", "2x1Gbps", "--bandwidth", "100Mbps",
                     "--compress", "fp32,fp16", "-o", str(tmp_path / "s.csv"), "--no-progress")
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines().count(note) == 1
    r = run_cli_here("plan", "--model", "digits-mlp", "--nodes", "2", "--nic", "2x1Gbps", "--bandwidth", "100Mbps",
                     "--global-batch", "32", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines().count(note) == 1


#: (setting, the notes' text): each accepted, with no effect on this configuration
NO_EFFECT = [
    ({"virtual_stages": 2}, "virtual_stages 2 unused: schedule gpipe is not interleaved"),
    ({"schedule": "1f1b", "virtual_stages": 2}, "virtual_stages 2 unused: schedule 1f1b is not interleaved"),
    ({"reshard_after_forward": False}, "reshard_after_forward False unused: zero 0 gathers no parameters"),
    ({"grad_compress": "qsgd-maxnorm:4"}, "grad_compress qsgd-maxnorm:4 unused: dp 1 has no data-parallel"),
    ({"bucket_size": "1MiB"}, "bucket_size 1048576 unused: dp 1 has no data-parallel"),
    ({"overlap": True}, "overlap True unused: dp 1 has no data-parallel"),
    ({"tied_embedding": "sync"}, "tied_embedding sync unused: no tied LM head on another device"),
    ({"grad_accumulation": "autograd"}, "grad_accumulation autograd unused: no GPU operator model"),
]


def test_settings_with_no_effect_are_said_only_when_the_caller_gave_them():
    base = perfsim.predict(**MLP).summary
    assert "model_note" not in base
    for setting, text in NO_EFFECT:
        s = perfsim.predict(**MLP, **setting).summary
        assert _figures(s) == _figures(perfsim.predict(**MLP, **{k: v for k, v in setting.items()
                                                                 if k == "schedule"}).summary), setting
        assert [n for n in unused_notes(s) if n.startswith(text)], (setting, s.get("model_note"))
        # the planner's candidates (perfsim.api.predict): the same setting passed to every one, silent
        assert "model_note" not in api_predict(**MLP, **setting).summary, setting
    # where they apply, nothing is said
    used = [dict(schedule="interleaved-1f1b", virtual_stages=2, pp=2), dict(zero=3, pp=1, dp=2, reshard_after_forward=False),
            dict(pp=1, dp=2, grad_compress="qsgd-maxnorm:4", bucket_size="1MiB", overlap=True)]
    for setting in used:
        assert not unused_notes(perfsim.predict(model="digits-mlp", **setting).summary), setting
    assert not unused_notes(perfsim.predict(model="gpt2-tiny", pp=2, tied_embedding="sync").summary)
    assert not unused_notes(perfsim.predict(model="gpt2-tiny", gpu="h100", pp=2, grad_accumulation="autograd").summary)


def test_predict_says_each_once_on_stderr():
    r = run_cli_here("predict", "--model", "digits-mlp", "--pp", "2", "--virtual-stages", "2",
                     "--no-reshard-after-forward", "--schedule", "gpipe,1f1b")
    assert r.returncode == 0, r.stderr
    notes = [line for line in r.stderr.splitlines() if line.startswith("note: ")]
    assert notes == ["note: virtual_stages 2 unused: schedule gpipe is not interleaved (its model chunks per "
                     "device are fixed)",
                     "note: reshard_after_forward False unused: zero 0 gathers no parameters (ZeRO-3 does)",
                     "note: virtual_stages 2 unused: schedule 1f1b is not interleaved (its model chunks per "
                     "device are fixed)"]
    r = run_cli_here("predict", "--model", "digits-mlp", "--pp", "2")
    assert r.returncode == 0 and "note:" not in r.stderr and "unused" not in r.stdout


def test_pipeline_compression_with_one_stage_is_said_unused():
    """qa3: `perfsim predict --pp 1 --compress aqsgd:fw3bw6,directq:fw4bw8,fp32` printed three
    identical predictions without a word (one stage has no pipeline boundary), as the gradient
    settings with dp 1 did before qa2."""
    one = dict(model="gpt2-tiny", pp=1)
    for extra in ({}, {"schedule": "interleaved-1f1b", "virtual_stages": 2}):
        s = perfsim.predict(**one, **extra, compress="aqsgd:fw3bw6").summary
        assert _figures(s) == _figures(perfsim.predict(**one, **extra).summary)
        assert unused_notes(s) == ["compress aqsgd:fw3bw6 unused: pp 1 has no pipeline boundary"], s.get("model_note")
        assert not unused_notes(api_predict(**one, **extra, compress="aqsgd:fw3bw6").summary)  # a planner's
    assert not unused_notes(perfsim.predict(**one, compress="fp32").summary)  # the identity: nothing to say
    assert not unused_notes(perfsim.predict(model="gpt2-tiny", pp=2, compress="aqsgd:fw3bw6").summary)


def test_zero_with_one_replica_and_kernels_a_profile_prices_are_said_unused():
    """qa6: `--zero 3` with dp 1 (nothing to shard over), and `--attention flash` / `--kernels`
    where the profile's measured layer times price the compute (no GPU operator model runs
    kernels), left the iteration as it was without a word: a user asking "how much does
    FlashAttention buy?" of the default profile read 0 %. Said now; silent where they apply."""
    tiny = dict(model="gpt2-tiny", pp=2, profile="traces/cpu-2core.json")
    base = perfsim.predict(**tiny).summary
    for setting, text, same in (
            ({"zero": 3}, "zero 3 unused: dp 1 has no replicas to shard over", FIGURES),
            ({"attention": "flash"}, "attention flash unused: the profile's measured layer times price the "
                                     "compute", ("iteration_s",)),      # its memory follows --attention
            ({"kernels": "fused"}, "kernels fused unused: the profile's measured layer times price the compute",
             FIGURES)):
        s = perfsim.predict(**tiny, **setting).summary
        assert {k: s.get(k) for k in same} == {k: base.get(k) for k in same}, setting
        assert [n for n in unused_notes(s) if n.startswith(text)], (setting, s.get("model_note"))
        assert not unused_notes(api_predict(**tiny, **setting).summary)  # a planner's candidate: silent
    gpu = dict(model="gpt2-tiny", gpu="h100")
    assert not unused_notes(perfsim.predict(**gpu, pp=2, attention="flash", kernels="eager").summary)
    assert not unused_notes(perfsim.predict(**gpu, pp=1, dp=2, zero=1).summary)
    offload = perfsim.predict(model="gpt2-tiny", gpu="h100", pp=1, zero=2, offload="optimizer").summary
    assert not unused_notes(offload)  # ZeRO-Offload on one GPU: zero 2 is what offloads


def test_compress_under_a_per_boundary_spec_for_every_boundary_is_said_unused():
    """qa6: `--compress aqsgd:fw3bw6 --boundary-compress 0=fp16` on 2 stages (one boundary, given
    its own spec) priced fp16 (89.3 ms at 100 Mbps, as without --compress) while the row's
    compress column read aqsgd:fw3bw6, without a word. Said now; silent where a boundary uses it."""
    two = dict(model="gpt2-tiny", pp=2, bandwidth="100Mbps", boundary_compress="0=fp16")
    s = perfsim.predict(**two, compress="aqsgd:fw3bw6").summary
    assert _figures(s) == _figures(perfsim.predict(**two).summary)
    assert unused_notes(s) == ["compress aqsgd:fw3bw6 unused: boundary_compress 0=fp16 gives every "
                               "pipeline boundary its own spec"], s.get("model_note")
    assert not unused_notes(api_predict(**two, compress="aqsgd:fw3bw6").summary)  # a planner's: silent
    three = dict(two, pp=3, model="gpt2-tiny")
    assert not unused_notes(perfsim.predict(**three, compress="aqsgd:fw3bw6").summary)  # boundary 1 uses it
