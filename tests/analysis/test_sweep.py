"""perfsim sweep: grid expansion, parallel run, resume after interruption, CLI errors.

Most tests drive the sweep with a small stand-in for perfsim.api.predict (a
closed-form pipeline model) so they test the sweep machinery alone; one test
runs the real simulator when it is there.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from perfsim.analysis.sweep import (
    SweepSpec, config_id, expand, load_sweep_file, part_path, read_table, run_sweep,
    sibling_path,
)
from perfsim.errors import ConfigError
from perfsim.result import STAGE_COLUMNS, SUMMARY_COLUMNS, Result

from _helpers import run_cli, run_cli_here

CALL_LOG = "PERFSIM_TEST_CALL_LOG"


def fake_predict(bandwidth=1e10, compress="fp32", pp=2, micro_batch=1, macro_batch=8,
                 schedule="gpipe", latency=0.0, **_):
    """Closed-form stand-in: GPipe with per-micro-batch compute 10 ms and a
    boundary message of 1 MB / bits * 32 (no simulator involved)."""
    compress = str(compress)  # a sweep hands predict the spec as a value (perfsim.compression.spec.Spec)
    if pp == 3:
        raise ConfigError("pp=3: 4 layers do not split into 3 stages")
    if os.environ.get(CALL_LOG):
        with open(os.environ[CALL_LOG], "a") as f:
            f.write(f"{compress} {bandwidth}\n")
    bits = {"fp32": 32, "directq:fw4bw8": 6, "aqsgd:fw3bw6": 4.5}.get(compress, 32)
    m = macro_batch // micro_batch
    comm = 1e6 * bits / 32 * 8 / bandwidth + latency
    step = 10e-3 + comm
    it = (m + pp - 1) * step
    summary = {"model": "fake", "bandwidth_bps": bandwidth, "latency_s": latency,
               "compress": compress, "grad_compress": "none", "schedule": schedule, "pp": pp,
               "dp": 1, "micro_batch": micro_batch, "macro_batch": macro_batch,
               "throughput_samples_per_s": macro_batch / it, "iteration_s": it,
               "bubble_fraction": (pp - 1) / (m + pp - 1), "source": "predicted"}
    stages = [{"replica": 0, "stage": s, "compute_s": m * 10e-3, "comm_s": m * comm,
               "encode_s": 0.0, "idle_s": it - m * step, "dp_sync_s": 0.0,
               "bytes_sent": m * 1e6 * bits / 32, "peak_inflight": m} for s in range(pp)]
    return Result(summary=summary, stages=stages)


class Interrupt:
    """A predict that is 'killed' (KeyboardInterrupt) after ``n`` calls."""

    def __init__(self, n):
        self.n = n

    def __call__(self, **params):
        if self.n == 0:
            raise KeyboardInterrupt
        self.n -= 1
        return fake_predict(**params)


def test_spec_normalises_and_expands():
    from perfsim.compression.spec import parse_spec
    from perfsim.params import plain as params_plain

    spec = SweepSpec({"bandwidth": "10Gbps,1000Mbps,1Gbps", "compress": ["fp32", "aqsgd:fw3bw6"],
                      "micro-batch": 2, "schedule": "GPipe"})
    assert spec.values["bandwidth"] == [1e10, 1e9]  # 1000Mbps == 1Gbps: one value
    assert spec.values["micro_batch"] == [2] and spec.values["schedule"] == ["gpipe"]
    assert spec.axes == ["compress", "bandwidth"] and len(spec) == 4
    grid = expand(spec)
    assert grid[0]["compress"] == parse_spec("fp32", "pipeline")  # the spec as a value
    assert params_plain(grid[0]) == {"schedule": "gpipe", "micro_batch": 2, "compress": "fp32",
                                     "bandwidth": 1e10}
    # the configuration id hashes the canonical text: the ids of stored sweeps stay valid
    assert config_id(grid[0]) == config_id(params_plain(grid[0]))
    assert [g["bandwidth"] for g in grid] == [1e10, 1e9, 1e10, 1e9]  # bandwidth fastest
    assert len({config_id(g) for g in grid}) == 4
    assert config_id({"a": 1, "b": 2}) == config_id({"b": 2, "a": 1})


def test_spec_other_predict_params():
    spec = SweepSpec({"partition": ["7,6,6,6,6,6,6,7", "6,6,6,6,6,6,6,8"], "overlap": "true,false",
                      "bucket-size": "25MiB", "intra_node_bandwidth": "300GB/s"})
    assert spec.values["partition"] == [(7, 6, 6, 6, 6, 6, 6, 7), (6, 6, 6, 6, 6, 6, 6, 8)]
    assert spec.values["overlap"] == [True, False]
    assert spec.values["bucket_size"] == [25 * 2**20]
    assert spec.values["intra_node_bandwidth"] == [2.4e12]
    with pytest.raises(ConfigError, match="overlap"):
        SweepSpec({"overlap": "maybe"})


@pytest.mark.parametrize("values,match", [
    ({"bandwidth": "100furlongs"}, "bandwidth"),
    ({"pp": "two"}, "pp"),
    ({"pp": 0}, "pp"),
    ({"dp": 1.5}, "dp"),
    ({"colour": "red"}, "colour"),
    ({"compress": ""}, "compress"),
    ({"compress": []}, "compress"),
])
def test_spec_rejects_bad_values(values, match):
    with pytest.raises(ConfigError, match=match):
        SweepSpec(values)


@pytest.mark.parametrize("line,culprit", [
    ("bandwidth = [100, 1000]", "bandwidth = 100"),   # ran at 100 bit/s: 178,210 s an iteration, exit 0
    ("latency = 5", "latency = 5"),                   # 5 s (meant 5 ms?)
    ("bucket-size = 25", "bucket_size = 25"),
    ("intra-node-bandwidth = 300.0", "intra_node_bandwidth = 300.0"),
    ("tcp-window = [4]", "tcp_window = 4"),
])
def test_a_sweep_file_number_needs_a_unit_as_its_flag_does(tmp_path, write_file, line, culprit):
    """qa3: a sweep file mirrors the flags, but `bandwidth = [100, 1000]` ran at 100 and 1000
    bit/s and `latency = 5` at 5 s, exit 0, where `--bandwidth 100` is refused. Zero is
    unambiguous (a zero latency, burst); text with a unit is read as the flag reads it."""
    f = write_file("s.toml", f'model = "gpt2-tiny"\npp = 2\n{line}\n')
    r = run_cli_here("sweep", str(f), "-o", str(tmp_path / "s.csv"), "--no-progress")
    assert r.returncode == 2 and culprit in r.stderr and "has no unit" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "s.csv").exists()
    f.write_text('model = "gpt2-tiny"\nlatency = [0, "5ms"]\nlink-burst = 0\nbandwidth = "1Gbps"\n')
    assert load_sweep_file(f).values["latency"] == [0.0, 0.005]


def test_a_sweep_file_key_given_twice_is_refused(write_file):
    """qa3: `link-burst = "0B"` and `link_burst = "50KB"` in one sweep file (TOML sees two keys)
    ran 50 KB alone, exit 0."""
    f = write_file("s.toml", 'model = "gpt2-tiny"\nlink-burst = "0B"\nlink_burst = "50KB"\n')
    with pytest.raises(ConfigError, match="link_burst given twice.*link-burst.*link_burst"):
        load_sweep_file(f)


def test_sweep_file(tmp_path, write_file):
    f = write_file("s.toml", 'model = "gpt2-xl"\nbandwidth = ["10Gbps", "100Mbps"]\n'
                             'grad-compress = "none,qsgd-maxnorm:4"\npp = 8\n')
    spec = load_sweep_file(f)
    assert {k: [str(v) for v in vs] if k == "grad_compress" else vs for k, vs in spec.values.items()} == \
        {"model": ["gpt2-xl"], "pp": [8], "grad_compress": ["none", "qsgd-maxnorm:4"], "bandwidth": [1e10, 1e8]}
    assert spec.merged({"pp": "2,4", "compress": None}).values["pp"] == [2, 4]
    bad = write_file("bad.toml", "bandwidth = [\n")
    with pytest.raises(ConfigError, match="bad.toml.*TOML"):
        load_sweep_file(bad)
    bad.write_text('bandwith = "1Gbps"\n')
    with pytest.raises(ConfigError, match="bandwith"):
        load_sweep_file(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_sweep_file(tmp_path / "missing.toml")


GRID = {"bandwidth": "10Gbps,1Gbps,100Mbps,10Mbps",
        "compress": "fp32,directq:fw4bw8,aqsgd:fw3bw6", "pp": "2,4"}


def test_sweep_writes_tidy_tables_in_parallel(tmp_path):
    out = tmp_path / "runs" / "s.csv"
    table = run_sweep(GRID, out, jobs=2, predict=fake_predict, progress=False)
    df = pd.read_csv(out)
    assert len(df) == 24 and list(df.columns[:len(SUMMARY_COLUMNS)]) == SUMMARY_COLUMNS
    assert df["config_id"].is_unique
    # grid order, and each row carries the figures of its own configuration
    assert list(df["pp"].iloc[[0, 12]]) == [2, 4]
    for _, row in df.iterrows():
        ref = fake_predict(bandwidth=row.bandwidth_bps, compress=row.compress, pp=row.pp)
        assert row.throughput_samples_per_s == pytest.approx(ref.summary["throughput_samples_per_s"])
    stages = pd.read_csv(sibling_path(out, "stages"))
    assert list(stages.columns) == ["config_id", *STAGE_COLUMNS]
    assert len(stages) == 12 * 2 + 12 * 4
    assert set(stages["config_id"]) == set(df["config_id"])
    assert not part_path(out).exists()
    assert table.summary.shape[0] == 24


def test_sweep_parquet(tmp_path):
    out = tmp_path / "s.parquet"
    run_sweep({"bandwidth": "1Gbps,100Mbps"}, out, jobs=1, predict=fake_predict, progress=False)
    assert len(pd.read_parquet(out)) == 2
    assert len(read_table(sibling_path(out, "stages"))) == 4


def test_interrupted_sweep_resumes(tmp_path, monkeypatch):
    out = tmp_path / "s.csv"
    with pytest.raises(KeyboardInterrupt):
        run_sweep(GRID, out, jobs=1, predict=Interrupt(7), progress=False)
    assert not out.exists()
    part = part_path(out)
    done = [json.loads(line) for line in part.read_text().splitlines()]
    assert len(done) == 7
    # a crash in the middle of a write leaves a torn last line: it is dropped
    with open(part, "a") as f:
        f.write('{"config_id": "deadbeef", "summ')
    log = tmp_path / "calls.log"
    monkeypatch.setenv(CALL_LOG, str(log))
    run_sweep(GRID, out, jobs=1, predict=fake_predict, progress=False)
    assert len(log.read_text().splitlines()) == 24 - 7  # only the missing ones ran
    df = pd.read_csv(out)
    fresh = run_sweep(GRID, None, jobs=1, predict=fake_predict, progress=False).summary
    pd.testing.assert_series_equal(df["throughput_samples_per_s"],
                                   fresh["throughput_samples_per_s"], check_names=False)
    # extending a finished sweep runs only the new points
    log.write_text("")
    run_sweep({**GRID, "bandwidth": GRID["bandwidth"] + ",1Mbps"}, out, jobs=1,
              predict=fake_predict, progress=False)
    assert len(log.read_text().splitlines()) == 6
    assert len(pd.read_csv(out)) == 30
    # --fresh starts over
    log.write_text("")
    run_sweep(GRID, out, jobs=1, predict=fake_predict, progress=False, resume=False)
    assert len(log.read_text().splitlines()) == 24


def test_invalid_configurations(tmp_path):
    grid = {"bandwidth": "1Gbps,100Mbps", "pp": "2,3"}
    with pytest.raises(ConfigError, match="pp=3"):
        run_sweep(grid, tmp_path / "a.csv", jobs=1, predict=fake_predict, progress=False)
    out = tmp_path / "b.csv"
    table = run_sweep(grid, out, jobs=1, predict=fake_predict, progress=False, skip_invalid=True)
    assert len(table.summary) == 2 and len(table.errors) == 2
    errors = pd.read_csv(sibling_path(out, "errors"))
    assert set(errors["pp"]) == {3} and errors["error"].str.contains("3 stages").all()
    # a sweep where nothing fits still writes a (header-only) table, and re-runs
    out = tmp_path / "c.csv"
    for _ in range(2):
        table = run_sweep({"pp": 3}, out, jobs=1, predict=fake_predict, progress=False,
                          skip_invalid=True)
        assert table.summary.empty and len(table.errors) == 1
        assert list(pd.read_csv(out).columns)[:3] == SUMMARY_COLUMNS[:3]


def test_run_errors(tmp_path):
    with pytest.raises(ConfigError, match="out.txt"):
        run_sweep(GRID, tmp_path / "out.txt", predict=fake_predict)
    with pytest.raises(ConfigError, match="jobs"):
        run_sweep(GRID, None, jobs=0, predict=fake_predict)


def test_a_table_that_is_not_a_sweeps_is_never_overwritten(tmp_path):
    """qa1: `perfsim sweep -o mine.csv` replaced a user's own CSV (no config_id column) without
    a word; a sweep table of another grid was already refused. Now both are, and --overwrite
    (resume=False) replaces it on purpose; an empty file is no one's table."""
    out = tmp_path / "mine.csv"
    out.write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError, match="not a perfsim sweep's"):
        run_sweep(GRID, out, predict=fake_predict)
    assert out.read_text() == "a,b\n1,2\n" and not part_path(out).exists()
    table = run_sweep(GRID, out, predict=fake_predict, resume=False)
    assert len(pd.read_csv(out)) == len(table.summary) > 0
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    assert len(run_sweep(GRID, empty, predict=fake_predict).summary) == len(table.summary)


@pytest.mark.parametrize("what", ["stages", "errors"])
def test_a_sibling_that_is_not_a_sweeps_is_never_overwritten(tmp_path, what):
    """qa3: `perfsim sweep -o r.csv` replaced the user's own r.stages.csv with the per-stage
    rows, and deleted the user's r.errors.csv (a stale errors table of an earlier grid is
    removed), exit 0. A sibling without config_id is someone else's: refused, as the table is."""
    out = tmp_path / "r.csv"
    sibling = tmp_path / f"r.{what}.csv"
    sibling.write_text("my,notes\n1,2\n")
    with pytest.raises(ConfigError, match=f"r.{what}.csv.*not a perfsim sweep's"):
        run_sweep(GRID, out, predict=fake_predict)
    assert sibling.read_text() == "my,notes\n1,2\n" and not out.exists()
    run_sweep(GRID, out, predict=fake_predict, resume=False)  # --overwrite: on purpose
    assert not sibling.exists() or "config_id" in sibling.read_text()


def test_pool_only_when_it_pays():
    from perfsim.analysis.sweep import POOL_STARTUP_S, use_pool

    assert not use_pool(7, 0.05, jobs=2)  # 8 quick configurations: in-process
    assert use_pool(100, 0.05, jobs=2)
    assert not use_pool(1000, 1.0, jobs=1)
    assert not use_pool(1, 10.0, jobs=2)
    assert use_pool(2, POOL_STARTUP_S * 1.01 * 2, jobs=2)


def test_small_grid_runs_in_process(tmp_path, monkeypatch):
    """A small grid of fast configurations never starts a process pool."""
    import perfsim.analysis.sweep as sw

    def no_pool(*a, **k):
        raise AssertionError("a pool was started")

    monkeypatch.setattr(sw, "_iter_pool", no_pool)
    table = run_sweep(GRID, None, jobs=2, predict=fake_predict, progress=False)
    assert len(table.summary) == len(SweepSpec(GRID))


def test_pool_gives_the_in_process_table(tmp_path):
    forced = run_sweep(GRID, tmp_path / "p.csv", jobs=2, pool=True, predict=fake_predict,
                       progress=False)
    here = run_sweep(GRID, tmp_path / "h.csv", jobs=2, pool=False, predict=fake_predict,
                     progress=False)
    pd.testing.assert_frame_equal(forced.summary, here.summary)


def test_pool_from_a_plain_script(tmp_path, write_file):
    """A script without ``if __name__ == "__main__"`` can sweep with a pool (the
    children do not re-run the script)."""
    script = write_file(
        "plain.py",
        "import os\n"
        "import perfsim\n"
        "from perfsim.analysis.sweep import run_sweep\n"
        "t = run_sweep({'model': 'gpt2-tiny', 'pp': 2, 'macro_batch': 4,\n"
        "               'bandwidth': ['1Gbps', '100Mbps', '10Mbps']}, None, jobs=2, pool=True,\n"
        "              progress=False)\n"
        "print('rows', len(t.to_frame()), os.getpid())\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("rows 3") == 1, proc.stdout


BAD_CLI = [
    (["--bandwidth", "100furlongs"], "100furlongs"),
    (["--pp", "0"], "pp"),
    (["missing.toml"], "missing.toml"),
    (["--out", "x.xlsx", "--bandwidth", "1Gbps"], "x.xlsx"),
    (["--link-burst", "lots", "--bandwidth", "1Gbps"], "--link-burst"),
]


@pytest.mark.parametrize("args,culprit", BAD_CLI)
def test_cli_bad_input_one_line_exit_2(tmp_path, monkeypatch, args, culprit):
    if args == BAD_CLI[0][0]:  # the first in a real process
        proc = run_cli("sweep", *args, cwd=tmp_path)
    else:  # the rest through perfsim.cli.main in this process, from the same folder
        monkeypatch.chdir(tmp_path)
        proc = run_cli_here("sweep", *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and culprit in lines[0], proc.stderr


def test_cli_interrupted_by_sigint_resumes(tmp_path):
    """Ctrl-C in the middle of a real sweep, then the same command again. The sweep starts with
    SIGINT at its default, as from a terminal: a suite started as a background job (``make test &``)
    passes SIGINT ignored down to every process it starts, and Python then leaves it ignored."""
    pytest.importorskip("perfsim.api")
    import signal
    import time

    out = tmp_path / "s.csv"
    args = [sys.executable, "-m", "perfsim", "sweep", "--model", "gpt2-tiny", "--pp", "2",
            "--macro-batch", "4", "--bandwidth", ",".join(f"{b}Mbps" for b in range(10, 410, 10)),
            "--compress", "fp32,fp16", "--jobs", "1", "--out", str(out), "--no-progress"]
    proc = subprocess.Popen(args, cwd=tmp_path, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    part = part_path(out)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if part.exists() and len(part.read_text().splitlines()) >= 3:
            break
        time.sleep(0.05)
    if proc.poll() is not None:
        pytest.skip("the sweep finished before it could be interrupted")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err
    done = len(part.read_text().splitlines())
    assert 3 <= done <= 80  # (80: stopped while writing the final table)
    if done < 80:
        assert not out.exists()
    again = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert f"resuming: {done} of 80 configurations already done" in again.stderr
    df = pd.read_csv(out)
    assert len(df) == 80 and df.config_id.is_unique and not part.exists()


def test_cli_real_simulator(tmp_path):
    """End to end through perfsim.api.predict (skipped until the simulator exists)."""
    pytest.importorskip("perfsim.api")
    out = tmp_path / "s.csv"
    proc = run_cli("sweep", "--bandwidth", "1Gbps,100Mbps", "--compress", "fp32,fp16",
                   "--model", "gpt2-tiny", "--pp", "2", "--macro-batch", "4", "--jobs", "2",
                   "--out", str(out), "--no-progress", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    df = pd.read_csv(out)
    assert len(df) == 4 and (df["throughput_samples_per_s"] > 0).all()
    # at 100 Mbps halving the activation bytes must help
    slow = df[df.bandwidth_bps == 1e8].set_index("compress")["throughput_samples_per_s"]
    assert slow["fp16"] > slow["fp32"]
    # the rows are exactly what predict returns for each configuration
    from perfsim.api import predict
    ref = predict(bandwidth="100Mbps", compress="fp16", model="gpt2-tiny", pp=2, macro_batch=4)
    assert slow["fp16"] == pytest.approx(ref.summary["throughput_samples_per_s"])
    stages = pd.read_csv(sibling_path(out, "stages"))
    assert len(stages) == 4 * 2 and set(stages.config_id) == set(df.config_id)
    # a configuration the simulator rejects: one line naming it, exit 2
    proc = run_cli("sweep", "--model", "gpt2-tiny", "--pp", "2", "--partition", "3,9", "--no-overlap",
                   "--out", str(tmp_path / "bad.csv"), "--no-progress", cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "partition" in lines[0], proc.stderr


def test_every_parameter_of_a_sweep_is_a_column_of_its_table(tmp_path):
    """qa3: `perfsim sweep --seq-len 32,64 --bucket-size 1MiB,25MiB` wrote 4 rows that no
    column told apart (the summary has neither seq_len nor the bucket size): only the
    config_id hash did. A parameter the summary does not show is a column of its own, its
    unit in its name; one the summary shows (bandwidth_bps, dp) is not repeated."""
    out = tmp_path / "s.csv"
    run_sweep({"model": "gpt2-tiny", "pp": 2, "dp": 2, "bandwidth": "1Gbps", "seq_len": "32,64",
               "bucket_size": "1MiB,25MiB"}, out, jobs=1, progress=False)
    df = pd.read_csv(out)
    assert list(df["seq_len"]) == [32, 32, 64, 64]
    assert list(df["bucket_size_bytes"]) == [2**20, 25 * 2**20] * 2
    assert "bandwidth" not in df.columns and "dp_bytes" in df.columns and df.columns[-1] == "config_id"
    r = run_cli_here("predict", "--model", "gpt2-tiny", "--pp", "2", "--seq-len", "32,64", "--format", "csv")
    assert r.returncode == 0, r.stderr
    assert list(pd.read_csv(io.StringIO(r.stdout))["seq_len"]) == [32, 64]
    text = run_cli_here("predict", "--model", "gpt2-tiny", "--pp", "2", "--seq-len", "32,64", "--gpu", "a100,h100",
                        "--host-overhead", "10us,20us").stdout
    head, rows = text.splitlines()[2], text.splitlines()[4:12]  # the table's header names what differs
    assert all(name in head for name in ("seq_len", "gpu", "host_overhead")), text
    assert len(set(tuple(r.split("│")[1:5]) for r in rows)) == 8, text  # every row told apart
