"""Numbers in the CSV files pplan reads are plain ASCII decimals.

Python's int() and float() also read `1_0` as 10 and other scripts' digits (`１２` fullwidth,
`١٢` Arabic-Indic) as 12, so a profile's seed or times could change unseen. A profile cell, a
`# key: value` metadata line and a timeline cell are refused instead, at their file and line with a
hint; what hand-written files hold (spaces around a value, a leading '+', '.5', '1E+2') still reads.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from planner.errors import PplanError, ProfileError
from planner.graph.edges import read_edges
from planner.profiling.profile import read_profile_text
from planner.report.inputs import read_timeline_text
from planner.schedules.actions import parse_action
from planner.units import plain_float, plain_int

from helpers.profiles import profile_csv

# two layers at micro-batch sizes 1 and 2; the first data row is line 4 (format, one metadata line, header)
ROWS = ["0,a,1,1.0,2.0,100,10,4", "0,a,2,2.0,4.0,100,20,8", "1,b,1,1.5,3.0,50,12,4", "1,b,2,3.0,6.0,50,24,8"]
COLUMNS = ["layer", "name", "micro_batch_size", "fwd_ms", "bwd_ms", "param_bytes", "activation_bytes", "output_bytes"]
TIMELINE = "device,stage,kind,microbatch,start_ms,end_ms\n"
# not plain: an underscore, fullwidth, Arabic-Indic and Devanagari digits (a no-break space around a
# value is stripped with the cell's other spaces: it changes no number)
NOT_PLAIN = ["1_0", "１２", "١٢", "१२"]


def _profile(meta: dict | None = None, column: str = "fwd_ms", value: str | None = None) -> str:
    """The two-layer profile, its first row's `column` set to `value` when given."""
    rows = list(ROWS)
    if value is not None:
        cells = rows[0].split(",")
        cells[COLUMNS.index(column)] = value
        rows[0] = ",".join(cells)
    return profile_csv({"input_bytes_per_sample": 16, **(meta or {})}, rows)


# ---- the parsers ------------------------------------------------------------------------------

# The grammar the readers promise, written out: plain_float and plain_int must accept exactly these.
_FLOAT_SPEC = re.compile(r"\s*[+-]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|(?i:nan|inf|infinity))\s*", re.ASCII)
_INT_SPEC = re.compile(r"\s*[+-]?[0-9]+\s*", re.ASCII)


def _accepts(parse, text: str) -> bool:
    try:
        parse(text)
    except ValueError:
        return False
    return True


def test_the_parsers_accept_exactly_plain_ascii_decimals() -> None:
    """Random strings over digits, signs, '.', 'e', '_', spaces, nan/inf letters and other scripts'
    digits and spaces: a string reads exactly when it fullmatches the written-out grammar."""
    rng = random.Random(7)
    alphabet = list("0123456789+-.eE_ \tnaifty") + ["１", "٣", "\u00a0", "\u3000", "x", "0x", "inf", "nan"]
    samples = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6))) for _ in range(20_000)]
    samples += NOT_PLAIN + ["\u00a012", " 1.5 ", "+1.5", ".5", "5.", "1E+2", "-3", "2.0", "NaN", "-inf", "Infinity", "007"]
    float_wrong = [s for s in samples if _accepts(plain_float, s) != bool(_FLOAT_SPEC.fullmatch(s))]
    int_wrong = [s for s in samples if _accepts(plain_int, s) != bool(_INT_SPEC.fullmatch(s))]
    assert not float_wrong and not int_wrong, (float_wrong[:10], int_wrong[:10])
    assert plain_float(" 1.5 ") == 1.5 and plain_float("+.5") == 0.5 and plain_int(" +7 ") == 7
    assert not _accepts(plain_int, "2.0")  # int() refused it in an integer field before: still refused


# ---- profile cells ------------------------------------------------------------------------------

@pytest.mark.parametrize("value", NOT_PLAIN + ["1_0.5", "1e1_0"])
def test_a_profile_time_that_is_not_plain_is_refused_at_its_line(value: str) -> None:
    with pytest.raises(ProfileError) as e:
        read_profile_text(_profile(value=value), source="p.csv")
    text = e.value.one_line()
    assert f"p.csv:4: column 'fwd_ms': {value!r} is not a number" in text and "digits 0-9" in text, text


@pytest.mark.parametrize("column", ["layer", "micro_batch_size"])
@pytest.mark.parametrize("value", ["７", "0_0", "٠"])
def test_a_profile_integer_that_is_not_plain_is_refused(column: str, value: str) -> None:
    with pytest.raises(ProfileError) as e:
        read_profile_text(_profile(column=column, value=value), source="p.csv")
    text = e.value.one_line()
    assert f"p.csv:4: column {column!r}:" in text and "is not an integer" in text and "digits 0-9" in text, text


def test_a_byte_column_that_is_not_plain_is_refused() -> None:
    with pytest.raises(ProfileError, match=r"p.csv:4: column 'param_bytes': '1_00' is not a number"):
        read_profile_text(_profile(column="param_bytes", value="1_00"), source="p.csv")


@pytest.mark.parametrize("column,value,read", [
    ("fwd_ms", " 1.5 ", 1.5), ("fwd_ms", "+1.0", 1.0), ("fwd_ms", ".5", 0.5), ("fwd_ms", "1.", 1.0),
    ("fwd_ms", "1E+0", 1.0), ("layer", " +0 ", 0), ("micro_batch_size", " 1", 1),
])
def test_plain_cells_as_people_write_them_still_read(column: str, value: str, read: float) -> None:
    p = read_profile_text(_profile(column=column, value=value), source="p.csv")
    assert p.names == ("a", "b") and p.micro_batch_sizes == (1, 2)
    if column == "fwd_ms":
        assert p.columns["fwd_ms"][0, 0] == read


def test_a_float_layer_index_is_still_refused() -> None:
    with pytest.raises(ProfileError, match=r"column 'layer': '0.0' is not an integer"):
        read_profile_text(_profile(column="layer", value="0.0"), source="p.csv")


# ---- metadata lines -----------------------------------------------------------------------------

@pytest.mark.parametrize("key,value,problem", [
    ("seed", "1_0", "is not an integer"), ("seed", "１２", "is not an integer"), ("threads", "٤", "is not an integer"),
    ("input_bytes_per_sample", "1_6", "is not a number"), ("elapsed_s", "١٢", "is not a number"),
    ("input_shape", "3,３２,32", "is not a comma-separated list of integers"), ("input_shape", "3,3_2", "is not a comma"),
])
def test_a_metadata_number_that_is_not_plain_is_refused_at_its_line(key: str, value: str, problem: str) -> None:
    text = _profile({key: value}).replace("# input_bytes_per_sample: 16\n", "") if key == "input_bytes_per_sample" else _profile({key: value})
    with pytest.raises(ProfileError) as e:
        read_profile_text(text, source="p.csv")
    line = e.value.one_line()
    assert re.match(r"p\.csv:[23]: metadata ", line) and f"{key!r}: {value!r} {problem}" in line and "digits 0-9" in line, line


def test_plain_metadata_numbers_still_read() -> None:
    p = read_profile_text(_profile({"seed": "+12", "threads": "4", "elapsed_s": "1.5e1", "input_shape": "3, 32, 32"}))
    assert p.meta["seed"] == "+12" and p.meta["elapsed_s"] == "1.5e1"


def test_a_seed_with_an_underscore_writes_no_plan(pplan, tmp_path: Path) -> None:
    """The audit's case: `# seed: 1_0` was read as seed 10 and written into the plan."""
    example = Path(__file__).resolve().parents[1] / "profiles" / "mlp.csv"
    path = tmp_path / "s.csv"
    path.write_text(example.read_text(encoding="utf-8").replace("# seed: 0\n", "# seed: 1_0\n"), encoding="utf-8")
    code, _, err = pplan("partition", path, "-n", "2", "--global-batch", "8", "-o", tmp_path / "s.json")
    assert code == 2 and "s.csv:3: metadata 'seed': '1_0' is not an integer" in err, err
    assert not (tmp_path / "s.json").exists()


# ---- timeline cells -----------------------------------------------------------------------------

@pytest.mark.parametrize("row,column,problem", [
    ("0,0,F,0,1_5.8,20", "start_ms", "is not a number"),
    ("0,0,F,0,0,１２", "end_ms", "is not a number"),
    ("١,0,F,0,0,1", "device", "is not an integer"),
    ("0,0_0,F,0,0,1", "stage", "is not an integer"),
    ("0,0,F,７,0,1", "microbatch", "is not an integer"),
])
def test_a_timeline_number_that_is_not_plain_is_refused_at_its_line(row: str, column: str, problem: str) -> None:
    with pytest.raises(PplanError) as e:
        read_timeline_text(TIMELINE + row + "\n", "t.csv")
    text = e.value.one_line()
    assert f"t.csv: line 2: column {column!r}:" in text and problem in text and "digits 0-9" in text, text


def test_plain_timeline_numbers_as_people_write_them_still_read() -> None:
    rows = read_timeline_text(TIMELINE + " 0 ,+0,F, 1,  1.5 ,+2e0\n", "t.csv")
    assert (rows[0].device, rows[0].stage, rows[0].microbatch, rows[0].start_ms, rows[0].end_ms) == (0, 0, 1, 1.5, 2.0)


@pytest.mark.parametrize("line,words", [
    ("# edge: 0->2 4_096", "bytes_per_sample '4_096' is not a number"),
    ("# edge: 0->２ 4096", "layers must be integers"),
])
def test_an_edge_line_number_that_is_not_plain_is_refused(line: str, words: str) -> None:
    with pytest.raises(ProfileError, match=re.escape(words)):
        read_edges([line], n_layers=4, source="p.csv")
    assert read_edges(["# edge: 0->2 4096"], n_layers=4, source="p.csv")[0].bytes_per_sample == 4096


def test_an_action_with_other_scripts_digits_is_no_action() -> None:
    assert str(parse_action("1F0")) == "1F0"
    with pytest.raises(PplanError):
        parse_action("１F０")  # fullwidth digits: \d read it as 1F0


@pytest.mark.parametrize("text", ["1,,2", "1,2,", "1_0", "１,2"])
def test_a_list_option_takes_plain_numbers_and_no_empty_item(text: str) -> None:
    from cli.common import parse_int_list

    with pytest.raises(PplanError, match="is not a comma-separated list of integers"):
        parse_int_list(text, "-b")
    assert parse_int_list(" 1, 2 ,4", "-b") == [1, 2, 4]


@pytest.mark.parametrize("text", ["8x64,", "8x64,,32x256", "8x6_4"])
def test_a_sizes_list_takes_plain_numbers_and_no_empty_item(text: str) -> None:
    from planner.bench.simulator_bench import parse_sizes

    with pytest.raises(PplanError, match="is not STAGESxMICROBATCHES"):
        parse_sizes(text)
    assert parse_sizes("8x64, 32x256") == [(8, 64), (32, 256)]
