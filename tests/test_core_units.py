import pytest

from planner.errors import PplanError
from planner.units import format_bytes, format_share, parse_bandwidth, parse_bytes, parse_ms


@pytest.mark.parametrize("text,expected", [
    ("16GiB", 16 * 2**30), ("500MB", 500 * 10**6), ("1000", 1000), ("1e9", 10**9),
    ("1.5 KiB", 1536), ("2g", 2 * 2**30), (4096, 4096),
])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["-1", "0", "abc", "1e30", "16XB", "", "nan", "inf"])
def test_parse_bytes_rejects(text):
    with pytest.raises(PplanError) as e:
        parse_bytes(text, "--memory")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("text,expected", [
    ("25GB/s", 25e9), ("400MB/s", 4e8), ("100Gbit/s", 100e9 / 8), ("1e9", 1e9), ("1GiB/s", 2**30),
])
def test_parse_bandwidth(text, expected):
    assert parse_bandwidth(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["-5GB/s", "0GB/s", "fast", "5 parsecs/s"])
def test_parse_bandwidth_rejects(text):
    with pytest.raises(PplanError):
        parse_bandwidth(text)


@pytest.mark.parametrize("text,expected", [("0.01ms", 0.01), ("5us", 0.005), ("1s", 1000.0), ("2", 2.0), ("0", 0.0)])
def test_parse_ms(text, expected):
    assert parse_ms(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["-1ms", "1h", "x"])
def test_parse_ms_rejects(text):
    with pytest.raises(PplanError):
        parse_ms(text)


def test_format_bytes():
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(512) == "512 B"
    assert format_bytes(3 * 2**30) == "3.0 GiB"


def test_a_size_below_one_byte_is_refused_not_rounded_to_zero():
    # hypothesis found `"memory": 0.5` in a cluster file becoming a device with 0 bytes
    with pytest.raises(PplanError, match="less than one byte"):
        parse_bytes(0.5, "memory")
    with pytest.raises(PplanError, match="less than one byte"):
        parse_bytes("0.5B", "--memory")
    assert parse_bytes("1B") == 1


@pytest.mark.parametrize("text,expected", [
    ("100Mbps", 100e6 / 8), ("200 Gb/s", 200e9 / 8), ("10kbps", 10e3 / 8), ("5Gbits/s", 5e9 / 8), ("8bps", 1.0),
    ("100MBps", 100e6), ("25GB/s", 25e9), ("100gbit/s", 100e9 / 8), ("1tbits/s", 1e12 / 8),  # 'bit' spelled out
])
def test_a_lower_case_b_in_a_bandwidth_is_a_bit_and_upper_case_a_byte(text, expected):
    # `100Mbps` was read as 100 MB/s: `ps` was dropped and the unit lower-cased, 8x too fast a link
    assert parse_bandwidth(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["25gb/s", "100mbps", "1tbps"])
def test_an_all_lower_case_bandwidth_is_refused_as_ambiguous(text):
    with pytest.raises(PplanError, match="ambiguous.*B/s for bytes or .*bit/s for bits"):
        parse_bandwidth(text)


def test_the_ambiguity_hint_keeps_a_binary_prefix():
    with pytest.raises(PplanError) as got:
        parse_bandwidth("25gib/s")
    assert "25GiB/s for bytes or 25Gibit/s for bits" in got.value.hint


def test_a_size_too_large_to_be_finite_says_so_rather_than_not_positive():
    with pytest.raises(PplanError, match=r"'1e400G' is too large \(not a finite number\)"):
        parse_bytes("1e400G", "--memory")


@pytest.mark.parametrize("part, whole, expected", [(0, 10, "0%"), (1, 1000, "<1%"), (4, 1000, "<1%"),
                                                   (6, 1000, "1%"), (1, 2, "50%"), (3, 2, "150%")])
def test_a_share_that_is_there_never_reads_as_zero_percent(part, whole, expected):
    assert format_share(part, whole) == expected
