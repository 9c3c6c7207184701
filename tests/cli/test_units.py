"""Units at the edge: bandwidths, times and sizes parsed once (b is bit, B is byte)."""

import pytest

from perfsim.errors import ConfigError
from perfsim.units import parse_bandwidth, parse_size, parse_time

from _helpers import assert_user_error, run_cli, run_cli_here


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
    """``MBps``/``GBps`` are bytes (they were read as bits), ``mb/s`` is accepted."""
    assert parse_bandwidth(text) == pytest.approx(bps)


@pytest.mark.parametrize("parse,text,hint", [
    (parse_bandwidth, "200", "200Mbps"),
    (parse_time, "40", "40ms"), (parse_size, "64mb", "64MB"), (parse_size, "1gib", "1GiB"),
])
def test_units_required_with_a_suggestion(parse, text, hint):
    """A bare number is not 200 bit/s or 40 s; bits are not a size."""
    with pytest.raises(ConfigError, match=hint):
        parse(text)


def test_unitless_values_rejected_on_the_command_line(tmp_path):
    for flag, value, hint in (("--bandwidth", "200", "200Mbps"), ("--latency", "40", "40ms")):
        proc = run_cli("predict", flag, value)
        assert_user_error(proc.returncode, proc.stderr, hint)
    assert parse_time("0") == 0.0  # a bare zero latency is unambiguous


@pytest.mark.parametrize("flag,bare", [("--bucket-size", "25"), ("--tcp-window", "4"), ("--link-burst", "50")])
def test_a_size_given_as_text_needs_a_unit(flag, bare):
    """qa3: `--bucket-size 25` (PyTorch's bucket_cap_mb=25) ran 25-byte buckets, 53 % slower
    (gpt2-tiny, dp 4, 1 Gbps); `--tcp-window 4` a 4-byte TCP window: 2503 s an iteration
    instead of 0.051 s, exit 0. Now refused as --bandwidth 200 is; 0 and Python ints stay bytes."""
    proc = run_cli_here("predict", "--model", "gpt2-tiny", "--pp", "1", "--dp", "4", flag, bare)
    assert_user_error(proc.returncode, proc.stderr, f"{flag} '{bare}': needs a unit, e.g. {bare}MiB")
    assert parse_size("0") == 0 and parse_size(" 0B ") == 0 and parse_size(25) == 25 and parse_size(25.0) == 25
    with pytest.raises(ConfigError, match="needs a unit"):
        parse_size("1e3")


def test_parse_time_and_size():
    assert parse_time("5ms") == pytest.approx(5e-3)
    assert parse_time("20us") == pytest.approx(2e-5)
    assert parse_time(0) == 0
    with pytest.raises(ConfigError):
        parse_time("-1ms")
    assert parse_size("64MB") == 64_000_000
    assert parse_size("1GiB") == 2**30
