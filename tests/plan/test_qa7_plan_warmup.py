"""The plan's time to loss pays the warm-up iterations a run starts with (qa7 finding F10).

``perfsim plan`` ranked by ``iteration_s x steps_ratio``: the steady state only. AQ-SGD trains
its whole first epoch uncompressed (fp32 activations forward), so a target reached within it is
reached at the warm-up's pace: gpt2-tiny on 2 nodes at 100 Mbps, aqsgd:fw2bw4 was ranked first,
"1.82 s to loss" (148 steps x 12.3 ms) where its 148 steps take 148 x 89.7 ms = 13.3 s, behind
directq:fw4bw8 (3.49 s), which compresses from its first step."""

import pytest

import perfsim

JOB = dict(model="gpt2-tiny", nodes=2, global_batch=32, bandwidth="100Mbps", grad_compress="none", pp=2,
           schedule="1f1b", micro_batch=1, jobs=1, top=10)


def test_time_to_loss_counts_the_warm_up_steps_at_their_pace():
    rows = perfsim.plan(**JOB).to_frame()
    by = rows.set_index("compress")
    dq, aq = by.loc["directq:fw4bw8"], by.loc["aqsgd:fw2bw4"]
    assert dq["warmup_iterations"] == 0 and aq["warmup_iterations"] > 0
    reference = dq["time_to_loss_s"] / (dq["iteration_s"] * dq["steps_ratio"])  # uncompressed steps to the loss
    steps = aq["steps_ratio"] * reference
    assert 100 < steps < aq["warmup_iterations"]  # reached inside AQ-SGD's uncompressed first epoch
    assert aq["time_to_loss_s"] == pytest.approx(steps * aq["warmup_iteration_s"], rel=1e-9)
    # the ranking follows the time to loss: a lossy method no longer wins on its steady state alone
    ranked = rows["compress"].tolist()
    assert ranked.index("directq:fw4bw8") < ranked.index("aqsgd:fw2bw4")
