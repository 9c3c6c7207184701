"""Foundation: units, schedules, CLI basics."""

import subprocess
import sys

import pytest

from perfsim.errors import ConfigError
from perfsim.schedules import Action, format_table, gpipe, max_in_flight, one_f_one_b
from perfsim.units import parse_bandwidth, parse_size, parse_time


@pytest.mark.parametrize("text,bps", [
    ("100Mbps", 1e8), ("10gbps", 1e10), ("1.5Gbps", 1.5e9), ("500 Kbps", 5e5),
    ("12.5MB/s", 1e8), ("1GB/s", 8e9), (2000, 2000.0), ("100mbit", 1e8),
])
def test_parse_bandwidth(text, bps):
    assert parse_bandwidth(text) == pytest.approx(bps)


@pytest.mark.parametrize("bad", ["100furlongs", "-5Mbps", "0", "0Mbps", "", "Mbps", "nan", "inf"])
def test_parse_bandwidth_rejects(bad):
    with pytest.raises(ConfigError, match="bandwidth"):
        parse_bandwidth(bad)


@pytest.mark.parametrize("text,bps", [
    ("100MBps", 8e8), ("100MB/s", 8e8), ("1GBps", 8e9), ("100mb/s", 1e8), ("100Mb/s", 1e8),
    ("100Mbit/s", 1e8), ("1Bps", 8.0), ("1kB/s", 8e3), ("10Tbps", 1e13),
])
def test_units_convention_b_is_bit_B_is_byte(text, bps):
    """Issue 14.3: ``MBps``/``GBps`` are bytes (they were read as bits), ``mb/s`` is accepted."""
    assert parse_bandwidth(text) == pytest.approx(bps)


@pytest.mark.parametrize("parse,text,hint", [
    (parse_bandwidth, "200", "200Mbps"),
    (parse_time, "40", "40ms"), (parse_size, "64mb", "64MB"), (parse_size, "1gib", "1GiB"),
])
def test_units_required_with_a_suggestion(parse, text, hint):
    """Issue 14.3: a bare number is not 200 bit/s or 40 s; bits are not a size."""
    with pytest.raises(ConfigError, match=hint):
        parse(text)


def test_unitless_values_rejected_on_the_command_line(tmp_path):
    for flag, value, hint in (("--bandwidth", "200", "200Mbps"), ("--latency", "40", "40ms")):
        proc = subprocess.run([sys.executable, "-m", "perfsim", "predict", flag, value],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert hint in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    assert parse_time("0") == 0.0  # a bare zero latency is unambiguous


def test_parse_time_and_size():
    assert parse_time("5ms") == pytest.approx(5e-3)
    assert parse_time("20us") == pytest.approx(2e-5)
    assert parse_time(0) == 0
    with pytest.raises(ConfigError):
        parse_time("-1ms")
    assert parse_size("64MB") == 64_000_000
    assert parse_size("1GiB") == 2**30


def test_gpipe_golden():
    assert format_table(gpipe(2, 3)) == (
        "stage 0: 0F0 0F1 0F2 0B0 0B1 0B2\n"
        "stage 1: 1F0 1F1 1F2 1B0 1B1 1B2")


def test_1f1b_golden():
    assert format_table(one_f_one_b(4, 6)) == (
        "stage 0: 0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0B3 0B4 0B5\n"
        "stage 1: 1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1F5 1B3 1B4 1B5\n"
        "stage 2: 2F0 2F1 2B0 2F2 2B1 2F3 2B2 2F4 2B3 2F5 2B4 2B5\n"
        "stage 3: 3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5")


@pytest.mark.parametrize("p,m", [(1, 1), (2, 1), (3, 2), (4, 8), (8, 32), (5, 3)])
def test_schedules_complete_and_bounded(p, m):
    for table in (gpipe(p, m), one_f_one_b(p, m)):
        for s, row in enumerate(table):
            assert sorted(row) == sorted([Action(s, "F", i) for i in range(m)] + [Action(s, "B", i) for i in range(m)])
            # a micro-batch's backward never precedes its forward
            seen = set()
            for a in row:
                if a.kind == "F":
                    seen.add(a.microbatch)
                else:
                    assert a.microbatch in seen
    assert [max_in_flight(r) for r in gpipe(p, m)] == [m] * p
    assert [max_in_flight(r) for r in one_f_one_b(p, m)] == [min(p - s, m) for s in range(p)]


def test_action_roundtrip():
    assert Action.parse("12B7") == Action(12, "B", 7)
    assert str(Action.parse("0F3")) == "0F3"
    with pytest.raises(ConfigError):
        Action.parse("zz")


def test_cli_version_and_help():
    out = subprocess.run([sys.executable, "-m", "perfsim", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("perfsim ")
    out = subprocess.run([sys.executable, "-m", "perfsim", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "COMMAND" in out.stdout
    out = subprocess.run([sys.executable, "-m", "perfsim", "--bogus"], capture_output=True, text=True)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
