"""qa8: perfsim plan searches CPU offload (ZeRO-Offload, arXiv:2101.06840) where predict models it.

plan never searched ``offload`` and refused a pinned ``--offload optimizer`` (its probe job ran
ZeRO 0): for llama2-7b on one H100 it said "no configuration ... fits" while
``predict --zero 2 --offload optimizer`` fits it in 17.5 GiB at 7.67 s an iteration (recompute full).
"""

import pytest

import perfsim
from perfsim.emit import emit

ONE_GPU = dict(model="llama2-7b", gpu="h100", gpus_per_node=1, nodes=1, global_batch=8, jobs=1, top=3)


def _predict(row: dict, **job) -> dict:
    keys = ("tp", "pp", "dp", "micro_batch", "zero", "offload", "recompute", "attention", "precision",
            "schedule", "sequence_parallel")
    return perfsim.predict(model=job["model"], gpu=job["gpu"], gpus_per_node=job["gpus_per_node"],
                           global_batch=job["global_batch"], **{k: row[k] for k in keys}).summary


def test_one_gpu_too_small_without_offload_plans_with_it():
    result = perfsim.plan(**ONE_GPU)
    best = result.rows()[0]
    assert best["offload"] == "optimizer" and best["zero"] == 2 and best["fits"]
    assert best["host_memory_gib"] > best["memory_capacity_gib"]  # the state lives in host memory
    want = _predict(best, **ONE_GPU)  # the same job through predict
    assert best["iteration_s"] == pytest.approx(want["iteration_s"], rel=1e-9)
    assert best["peak_memory_gib"] == pytest.approx(want["peak_memory_gib"], rel=1e-9)
    assert "offload=optimizer" in result.explanation  # the stated reason names it


def test_the_explanation_accounts_for_the_optimizer_step():
    """The winner's paragraph listed compute, communication, sync and idle time but not the
    optimizer step: 2200 ms of a 3885 ms iteration explained, the host's 1685 ms Adam step
    (the reason offload is slow) left out."""
    result = perfsim.plan(**ONE_GPU)
    best = result.rows()[0]
    assert best["optimizer_s"] > 0.3 * best["iteration_s"]
    assert f"optimizer step {best['optimizer_s'] * 1e3:.1f} ms" in result.explanation


def test_pinned_offload_plans_and_megatron_emit_says_it_is_not_emitted():
    result = perfsim.plan(**{**ONE_GPU, "gpus_per_node": 2}, offload="optimizer")
    rows = result.rows()
    assert rows and all(r["offload"] == "optimizer" and r["zero"] >= 2 for r in rows)
    text = emit(result.ranked[0].params, "megatron", nodes=1, global_batch=8)
    assert "no Megatron-LM flag is emitted" in text


def test_a_pinned_zero_stage_is_kept_on_one_replica():
    """One replica offloads at ZeRO-2 unless the user pinned stages below 2: then no offload there."""
    from perfsim.plan import SearchSpace, candidates

    cands, _ = candidates(model="gpt2", gpu="h100", nodes=1, gpus_per_node=2, global_batch=8,
                          space=SearchSpace(zero=1))
    assert {c.params["dp"] for c in cands} == {1, 2}
    assert all(c.params.get("zero", 0) < 2 and c.params.get("offload", "none") == "none" for c in cands)
    cands, _ = candidates(model="gpt2", gpu="h100", nodes=1, gpus_per_node=2, global_batch=8)  # unpinned
    assert any(c.params["dp"] == 1 and c.params.get("offload") == "optimizer" and c.params["zero"] == 2
               for c in cands)
