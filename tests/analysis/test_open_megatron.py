"""Megatron-LM's weak-scaling table (arXiv:2104.04473, Table 1) as open multi-node data:
the stored transcription is self-consistent, each row carries the configuration Megatron-LM's
examples/sc21/run_table_1.sh states, and scripts/megatron_open_data.py predicts every row in
it and reports the signed error (nothing fitted to them)."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("megatron_open_data", ROOT / "scripts" / "megatron_open_data.py")
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)


@pytest.fixture(scope="module")
def table():
    return mod.load()


def test_transcription_is_consistent_with_the_papers_own_formulas(table):
    doc, rows = table
    V, s = doc["workload"]["vocab"], doc["workload"]["seq_len"]
    assert len(rows) == 10 and doc["source"].startswith("Narayanan et al.") and "arXiv:2104.04473" in doc["source"]
    for r in rows:
        # eq. (2): the parameter count from layers and hidden size (1.7 B is 1.65 by it, 3.6 is 3.56)
        assert mod.param_count(r, V, s) / 1e9 == pytest.approx(r["params_b"], rel=0.03), r
        assert r["gpus"] % (r["tp"] * r["pp"]) == 0 and r["tp"] <= 8
        assert r["global_batch"] % (r["gpus"] // (r["tp"] * r["pp"])) == 0
        # aggregate = per GPU x GPUs; % of the A100's 312 TFLOP/s fp16 peak
        assert r["aggregate_pflops"] == pytest.approx(r["tflops_per_gpu"] * r["gpus"] / 1e3, rel=0.01), r
        assert r["percent_peak"] == pytest.approx(100 * r["tflops_per_gpu"] / 312, abs=0.6), r
    # measured time back from eq. (3): the 1T row runs ~103 s per iteration
    assert mod.measured_time(rows[-1], V, s) == pytest.approx(102.6, abs=0.1)


def test_each_row_states_the_configuration_it_ran_with(table):
    doc, rows = table
    src = doc["configuration"]["source"]
    assert "examples/sc21/run_table_1.sh" in src and "79a3bb6bf2c85b748c46749dd0695e23310d4e16" in src
    for r in rows:
        d = r["gpus"] // (r["tp"] * r["pp"])
        # whole micro-batches per replica; Megatron's interleaved schedule also needs m % p == 0
        assert (r["global_batch"] // d) % r["micro_batch"] == 0, r
        lpv = r["layers_per_virtual_stage"]
        assert r["virtual_stages"] == (r["layers"] // r["pp"] // lpv if lpv else 1), r
        if r["virtual_stages"] > 1:
            assert (r["layers"] // r["pp"]) % lpv == 0 and (r["global_batch"] // d // r["micro_batch"]) % r["pp"] == 0
        assert r["ddp_impl"] in mod.DDP_IMPL
    assert [r["virtual_stages"] for r in rows] == [1, 1, 1, 1, 1, 3, 2, 2, 3, 1]
    # what is still assumed is said, with the evidence for it
    assert {"recompute", "pipeline_messages"} <= set(doc["assumptions"])


def test_row_config_is_the_stated_one_unless_overridden(table):
    _, rows = table
    r76, r1t, r17 = rows[5], rows[-1], rows[0]
    assert mod.row_config(r76) == (2, "interleaved-1f1b", 3, "local")
    assert mod.row_config(r17) == (16, "1f1b", 1, "torch")
    assert mod.row_config(r1t) == (1, "1f1b", 1, "local")
    assert mod.row_config(r76, assumed=True) == (1, "1f1b", 1, "local")
    # an interleaved override keeps stated chunks, else the fewest Megatron accepts
    assert mod.row_config(r1t, schedule="interleaved-1f1b") == (1, "interleaved-1f1b", 2, "local")
    assert mod.row_config(r76, schedule="interleaved-1f1b", assumed=True)[2] == 3  # 15 layers: 3
    assert mod.row_config(r76, micro_batch=4, ddp_impl="torch") == (4, "interleaved-1f1b", 3, "torch")
    with pytest.raises(ValueError, match="ddp_impl"):
        mod.row_config(r76, ddp_impl="apex")
    # each DDP implementation is a set of predict keywords
    from perfsim.params import BY_NAME
    for kw in mod.DDP_IMPL.values():
        assert set(kw) <= set(BY_NAME)


def test_rows_are_predicted_with_signed_errors(table):
    doc, rows = table
    V, s = doc["workload"]["vocab"], doc["workload"]["seq_len"]
    res = mod.evaluate(doc, [rows[0], rows[2], rows[4]])  # dp only, tp 4, tp 8 x pp 2 across nodes
    assert [(r["run_micro_batch"], r["run_ddp"]) for r in res] == [(16, "torch"), (16, "torch"), (4, "local")]
    for r in res:
        assert r["predicted_tflops"] * 1e12 * r["predicted_s"] * r["gpus"] == pytest.approx(mod.model_flops(r, V, s))
        assert r["error"] == pytest.approx((r["predicted_s"] - r["measured_s"]) / r["measured_s"])
        assert abs(r["error"]) < 0.3, r  # a mechanism gone wrong shows here first
        assert r["fits"]
    assert res[2]["dp_sync_s"] > 0 and res[2]["tp_comm_s"] > 0
    m, signed = mod.summary(res)
    assert m >= abs(signed)
    assert mod.worst(res)["error"] == max((r["error"] for r in res), key=abs)
    # the stated micro-batch 16 with full recomputation fits in 80 GB; without it, it would not
    assert res[0]["peak_gib"] < 80
    (none,) = mod.evaluate(doc, [rows[0]], recompute="none")
    assert not none["fits"]
    # the torch DDP row overlaps its all-reduce with the backward: local reduces after it
    (local,) = mod.evaluate(doc, [rows[0]], ddp_impl="local")
    assert local["predicted_s"] > res[0]["predicted_s"]


def test_the_stated_interleaving_reaches_the_prediction(table):
    doc, rows = table
    (inter,) = mod.evaluate(doc, [rows[5]])  # 76.1B: 15 layers per stage, 5 per chunk
    (flat,) = mod.evaluate(doc, [rows[5]], schedule="1f1b")
    assert inter["run_virtual_stages"] == 3 and flat["run_virtual_stages"] == 1
    assert inter["idle_s"] < flat["idle_s"]  # the bubble shrinks with v
    assert mod.bubble(inter) == pytest.approx(mod.bubble(flat) / 3)


def test_cli_prints_mape_and_signed_error(capsys):
    assert mod.main(["--micro-batch", "x"]) == 2
    assert "bad --micro-batch" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        mod.main(["--ddp", "apex"])
    assert exc.value.code == 2
    capsys.readouterr()
    assert mod.main(["--set", "bogus=1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bogus" in err


def test_each_pipeline_candidate_is_a_predict_switch_with_a_reason_and_moves_the_row(table):
    from perfsim.params import PARAMS

    names = {p.name for p in PARAMS}
    for label, kw, why in mod.CANDIDATES:
        assert set(kw) <= names and why, label
    doc, rows = table
    out = dict((label, res[0]) for label, _, res in mod.candidates(doc, [rows[4]]))  # tp 8 x pp 2 across nodes
    assert list(out) == ["as stated"] + [c[0] for c in mod.CANDIDATES]
    stated = out["as stated"]
    assert out["p2p bandwidth: half the NIC rate"]["predicted_s"] > stated["predicted_s"]
    assert out["p2p latency per hop"]["predicted_s"] > stated["predicted_s"]
    # the factor that would make the row's compute (and its bubble) meet the measurement
    k = mod.compute_factor(stated)
    assert stated["predicted_s"] + (k - 1) * (stated["compute_s"] + stated["idle_s"]) == \
        pytest.approx(stated["measured_s"])


def test_interleaved_rows_get_the_chunk_counts_megatron_accepts():
    # each chunk a whole number of layers: the 529.6B row's 3 layers per device -> 3, 1T's 2 -> 2
    assert [mod.megatron_chunks(n) for n in (10, 6, 3, 2, 15, 1)] == [2, 2, 3, 2, 3, 1]


def test_single_node_effect_predicts_the_calibration_rows_as_that_script_does():
    import perfsim.api as api

    plain = api.predict
    res = mod.single_node_effect({}, every=60)
    if not res:
        pytest.skip("no single-node A100 data (../shared/data/a100-single-node)")
    assert [r[0] for r in res] == ["calibration", "validation"]
    for _, n, before, after in res:
        assert n > 0 and before == after  # nothing switched on: the same rows, the same predictions
    switched = mod.single_node_effect({"p2p_protocol": "rendezvous"}, every=60)
    assert [r[1] for r in switched] == [r[1] for r in res] and api.predict is plain


def test_batched_exchange_is_the_blocking_exchange_option(table, capsys, monkeypatch):
    """``--batched-exchange`` is predict's ``p2p_exchange=blocking`` (perfsim.schedules.exchange_rows):
    the same figures as ``--set p2p_exchange=blocking``, slower than as stated on an interleaved row."""
    doc, rows = table
    (before,) = mod.evaluate(doc, [rows[5]])
    (blocking,) = mod.evaluate(doc, [rows[5]], p2p_exchange="blocking")
    assert blocking["predicted_s"] > before["predicted_s"]
    monkeypatch.setattr(mod, "load", lambda: (doc, [rows[5]]))  # that row alone: cheap
    assert mod.main(["--batched-exchange"]) == 0
    flag = capsys.readouterr().out
    assert mod.main(["--set", "p2p_exchange=blocking"]) == 0
    assert capsys.readouterr().out == flag and f"{blocking['predicted_s']:.2f}" in flag


def test_the_2021_gradient_accumulation_is_recorded_with_its_source_and_is_a_candidate(table):
    """No gradient accumulation fusion in 2021 (docs/model.md, "Gradient accumulation per
    micro-batch"): the data file says so with its sources, and the candidate switches exactly that
    on: slower on a row of many micro-batches (39.1B: 12 per replica)."""
    doc, rows = table
    said = doc["configuration"]["grad_accumulation"]
    assert "grad_accumulation=autograd" in said and "02bb1f5c86fc8c36d4a96a2b7ebcf63d53219369" in said
    assert "060fb402252cd1104f6c5de30a69e5b19c2180f3" in said and "Inferred" in said
    [kw] = [kw for label, kw, _ in mod.CANDIDATES if "accumulation" in label]
    assert kw == {"grad_accumulation": "autograd"}
    many = rows[4]  # 1536 / 32 replicas / micro-batch 4 = 12 micro-batches
    stated = mod.evaluate(doc, [many])[0]
    switched = mod.evaluate(doc, [many], **kw)[0]
    assert switched["predicted_s"] > stated["predicted_s"] and switched["compute_s"] > stated["compute_s"]


def test_exact_kernels_prices_every_kernel_and_restores_the_default(table):
    """``--exact-kernels`` (block_ops exact): on the 1.7B row (attention core ~44 % of a layer at
    sequence 2048) the exact bytes are fewer -- the causal softmax's triangle, one-pass dropout
    backwards -- than the kernels it adds cost, so the row is predicted faster; the default is back
    afterwards, and the single-node check runs its second pass with it."""
    import perfsim.engine.compute as compute

    plain = compute.block_ops
    doc, rows = table
    (before,) = mod.evaluate(doc, [rows[0]])
    with mod.exact_kernels():
        assert compute.block_ops is not plain
        (inside,) = mod.evaluate(doc, [rows[0]])
    (after,) = mod.evaluate(doc, [rows[0]])
    assert compute.block_ops is plain
    assert inside["predicted_s"] < before["predicted_s"] == after["predicted_s"]
    res = mod.single_node_effect({}, every=60, exact=True)
    if res:
        assert all(before != after for _, _, before, after in res) and compute.block_ops is plain


def test_refit_runs_calibrate_a100_with_the_same_kernels(monkeypatch):
    """``--refit``: calibrate_a100.py's own fit (``--every 2 --iters 150``), inside exact_kernels
    when asked; its exit status stops the script (the fit itself takes minutes: not run here)."""
    import types

    import perfsim.engine.compute as compute

    plain, seen = compute.block_ops, []

    def main(argv):
        seen.append((argv, compute.block_ops is not plain))
        return 1

    monkeypatch.setattr(mod, "calibrate_module", lambda: types.SimpleNamespace(main=main))
    assert mod.refit(exact=True) == 1 and mod.refit() == 1
    assert seen == [(["--every", "2", "--iters", "150"], True), (["--every", "2", "--iters", "150"], False)]
    assert mod.main(["--refit", "--exact-kernels"]) == 1 and compute.block_ops is plain


def test_exact_items_each_switch_one_part_of_the_exact_list(table):
    """``--exact-items``: each item substitutes (restates) or adds only its own kernels; an added kernel
    makes the 1.7B row slower, a restated backward that moves fewer bytes faster; all items together
    are the exact list."""
    import perfsim.engine.compute as compute
    from perfsim.models.ops import block_ops
    from perfsim.models.registry import get_spec

    plain = compute.block_ops
    names = set().union(*(n for _, n in mod.EXACT_ITEMS))
    spec = get_spec("gpt:layers=2,hidden=2304,heads=24,seq=2048,vocab=51200", None)
    with mod.exact_item(frozenset(names)):
        assert sorted(map(repr, compute.block_ops(spec, 16, 2, False, 2))) == \
            sorted(map(repr, block_ops(spec, 16, 2, False, 2, exact=True)))
    doc, rows = table
    (base,) = mod.evaluate(doc, [rows[0]])
    moved = {}
    for label, item in mod.EXACT_ITEMS:
        with mod.exact_item(item):
            (r,) = mod.evaluate(doc, [rows[0]])
        moved[label] = r["predicted_s"] - base["predicted_s"]
    assert compute.block_ops is plain
    assert moved["QKV bias add"] > 0 and moved["residual-gradient sums"] > 0
    assert moved["causal softmax's triangle"] < 0 and moved["attention dropout one-pass backward"] < 0


def test_gemm_quantization_flag(monkeypatch, capsys):
    """``--gemm-quantization Q``: the data's a100-sxm4-80gb preset priced with its curve's
    ``gemm_quantization`` Q (calibrate_a100.py's ``set_gemm_quantization``), passed to ``--refit``;
    a bad value or ``--single-node`` with it is one line, exit 2."""
    import types

    from perfsim import hardware

    monkeypatch.setitem(hardware.GPUS, "a100-sxm4-80gb", hardware.GPUS["a100-sxm4-80gb"])  # restored
    seen = []
    cal = types.SimpleNamespace(set_gemm_quantization=lambda q: seen.append(("set", q)),
                                main=lambda argv: seen.append(("fit", argv)) or 1)
    monkeypatch.setattr(mod, "calibrate_module", lambda: cal)
    assert mod.main(["--gemm-quantization", "waves", "--refit"]) == 1
    assert seen == [("set", "waves"), ("fit", ["--every", "2", "--iters", "150", "--gemm-quantization", "waves"])]
    monkeypatch.undo()
    monkeypatch.setitem(hardware.GPUS, "a100-sxm4-80gb", hardware.GPUS["a100-sxm4-80gb"])
    assert mod.main(["--gemm-quantization", "tiles"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "gemm_quantization" in err
    assert mod.main(["--gemm-quantization", "waves", "--single-node"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert hardware.GPUS["a100-sxm4-80gb"].curve.gemm_quantization == "off"
