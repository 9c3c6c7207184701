"""`perfsim predict` command line: default run, grids, formats, errors."""

import csv
import io
import json

import pytest

from perfsim.cli import main


def run(capsys, *argv):
    code = main(["predict", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_default_run(capsys):
    code, out, err = run(capsys)
    assert code == 0, err
    for word in ("gpt2-xl", "10Gbps", "gpipe", "samples/s", "per stage", "per micro-batch", "45.0", "135.0"):
        assert word in out
    # the documented setup: the AQ-SGD paper's equal stages (the head folded, as the profile says)
    assert "52.5" not in out and "20.2" not in out and "0-6" in out and "43-49" in out


def test_csv_grid_has_every_combination(capsys):
    code, out, _ = run(capsys, "--bandwidth", "10Gbps,100Mbps", "--compress", "fp32,directq:fw4bw8",
                       "--format", "csv", "--macro-batch", "8")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 4
    for col in ("bandwidth_bps", "latency_s", "compress", "grad_compress", "schedule", "pp", "dp",
                "micro_batch", "macro_batch", "throughput_samples_per_s", "iteration_s", "bubble_fraction"):
        assert col in rows[0]
    assert {(r["bandwidth_bps"], r["compress"]) for r in rows} == {
        ("10000000000.0", "fp32"), ("10000000000.0", "directq:fw4bw8"),
        ("100000000.0", "fp32"), ("100000000.0", "directq:fw4bw8")}
    assert all(r["source"] == "predicted" for r in rows)


def test_json_output_file_and_trace(capsys, tmp_path):
    out_file, trace = tmp_path / "r.json", tmp_path / "t.json"
    code, out, err = run(capsys, "--macro-batch", "4", "--output", str(out_file), "--trace", str(trace))
    assert code == 0 and out == "" and "wrote" in err
    data = json.loads(out_file.read_text())  # one configuration: one object
    assert data["summary"]["macro_batch"] == 4 and len(data["stages"]) == 8
    assert len(data["microbatches"]) == 8 * 4
    events = json.loads(trace.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["cat"] for e in spans} >= {"compute", "comm"}
    assert all(e["dur"] > 0 and e["ts"] >= 0 for e in spans)
    assert not list(tmp_path.glob(".*"))  # no temp files left behind


def test_a_grids_traces_are_named_on_stderr(capsys, tmp_path):
    """qa1: `--bandwidth 1Gbps,10Mbps --trace t.json` wrote t-0.json and t-1.json and said
    nothing: no t.json (or an old one, stale), and no word of which file holds which row."""
    trace = tmp_path / "t.json"
    code, out, err = run(capsys, "--macro-batch", "4", "--bandwidth", "1Gbps,10Mbps", "--compress", "fp32,fp16",
                         "--format", "csv", "--trace", str(trace))
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    for i, (bw, c) in enumerate([("1Gbps", "fp32"), ("10Mbps", "fp32"), ("1Gbps", "fp16"), ("10Mbps", "fp16")]):
        path = tmp_path / f"t-{i}.json"
        assert f"wrote trace {path} (compress={c}, bandwidth={bw})" in err
        assert rows[i]["compress"] == c and float(rows[i]["bandwidth_bps"]) == {"1Gbps": 1e9, "10Mbps": 1e7}[bw]
        assert json.loads(path.read_text())["traceEvents"]
    assert not trace.exists()


@pytest.mark.parametrize("argv,culprit", [
    ("--bandwidth 100furlongs", "100furlongs"),
    ("--bandwidth=-5Mbps", "-5Mbps"),
    ("--bandwidth 0", "bandwidth"),
    ("--partition 1,2,3", "partition"),
    ("--partition 1,1,1,1,1,1,1,1", "partition"),
    ("--macro-batch 33 --micro-batch 2", "macro_batch"),
    ("--compress zip:4", "zip"),
    ("--grad-compress nope --dp 2", "nope"),
    ("--grad-compress nope", "nope"),
    ("--model gpt5", "gpt5"),
    ("--schedule zigzag", "zigzag"),
    ("--pp two", "pp"),
    ("--profile /nonexistent/p.json", "profile"),
    ("--link-burst 5furlongs", "--link-burst"),
])
def test_bad_input_one_line_exit_2(capsys, argv, culprit):
    code, out, err = run(capsys, *argv.split())
    assert code == 2
    assert err.count("\n") == 1 and culprit in err and "Traceback" not in err


def test_malformed_files(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{oops")
    for flag in ("--topology", "--profile", "--workload"):
        code, _, err = run(capsys, flag, str(bad))
        assert code == 2 and "malformed" in err and err.count("\n") == 1


@pytest.mark.parametrize("workload,topology", [
    ("example-workload", "example-geo"),  # by name: package data, works from a wheel
    ("perfsim/data/example-workload.toml", "perfsim/data/example-geo-topology.toml")])
def test_shipped_examples(capsys, workload, topology):
    code, out, err = run(capsys, "--workload", workload, "--topology", topology, "--pp", "4",
                         "--dp", "2", "--macro-batch", "8", "--profile", "default-v100", "--format", "json")
    assert code == 0, err
    s = json.loads(out)["summary"]
    assert s["model"] == "encoder-24" and s["topology"] == topology
    assert s["replicas_simulated"] == 2  # the degraded pair makes replica 0 differ


def test_unknown_shipped_name_lists_the_known_ones(capsys):
    code, _, err = run(capsys, "--topology", "example-moon")
    assert code == 2 and "example-moon" in err and "example-geo" in err and len(err.splitlines()) == 1


def test_installed_default_profile_is_package_data():
    from perfsim.profile import default_profile_path

    p = default_profile_path()
    assert p.parent.name == "data" and p.parent.parent.name == "perfsim"
    assert p.read_text() == (p.parent.parent.parent / "traces" / p.name).read_text()


def test_table_to_file_keeps_stdout_clean(capsys, tmp_path):
    out_file = tmp_path / "r.txt"
    code, out, _ = run(capsys, "--macro-batch", "4", "--output", str(out_file))
    assert code == 0 and out == ""
    assert "samples/s" in out_file.read_text() and "per stage" in out_file.read_text()


def test_link_mechanism_flags(capsys):
    """--link-burst lets small messages pass at once (never slower); --p2p-protocol
    rendezvous makes a send wait for its receiver (never faster)."""
    base = ["--model", "gpt2-tiny", "--pp", "2", "--macro-batch", "8", "--bandwidth", "100Mbps",
            "--compress", "aqsgd:fw3bw6", "--format", "csv"]

    def tput(*extra):
        code, out, err = run(capsys, *base, *extra)
        assert code == 0, err
        return float(next(csv.DictReader(io.StringIO(out)))["throughput_samples_per_s"])

    eager = tput()
    assert tput("--link-burst", "50KB") > eager
    assert tput("--p2p-protocol", "rendezvous") < eager


def test_schedules_grid_with_virtual_stages(capsys):
    """--virtual-stages sets interleaved 1F1B's chunks; the other schedules keep their own."""
    code, out, err = run(capsys, "--schedule", "1f1b,interleaved-1f1b,zb-h1,zb-v", "--virtual-stages", "4",
                         "--macro-batch", "16", "--format", "csv")
    assert code == 0, err
    rows = {r["schedule"]: r for r in csv.DictReader(io.StringIO(out))}
    assert {k: rows[k]["virtual_stages"] for k in rows} == {"1f1b": "1", "interleaved-1f1b": "4",
                                                           "zb-h1": "1", "zb-v": "2"}
    assert float(rows["zb-h1"]["bubble_fraction"]) < float(rows["1f1b"]["bubble_fraction"])
    code, _, err = run(capsys, "--schedule", "interleaved-1f1b", "--pp", "4", "--macro-batch", "9")
    assert code == 2 and "num_microbatches=9" in err and len(err.strip().splitlines()) == 1


def test_json_is_an_object_for_one_configuration_and_a_list_for_several(capsys):
    code, out, err = run(capsys, "--bandwidth", "1Gbps", "--format", "json")
    assert code == 0, err
    assert json.loads(out)["summary"]["bandwidth_bps"] == 1e9
    code, out, err = run(capsys, "--bandwidth", "1Gbps,100Mbps", "--format", "json")
    assert code == 0, err
    assert [r["summary"]["bandwidth_bps"] for r in json.loads(out)] == [1e9, 1e8]
