"""Profile and timeline CSVs from someone else: every hostile file is one line of error.

Each file is a committed example (profiles/mlp.csv) or a small timeline with one thing made
hostile: a cell past the csv module's field limit, a line of a megabyte, a name that would
retitle or rewrite the terminal, a number past any range, a timeline with no rows.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from planner.errors import PplanError, ProfileError
from planner.profiling.csvio import MAX_LINE_CHARS, check_line_lengths, count_lines
from planner.profiling.profile import load_profile
from planner.report.inputs import read_timeline, read_timeline_text

EXAMPLE = Path(__file__).resolve().parents[1] / "profiles" / "mlp.csv"
HEADER = "device,stage,kind,microbatch,start_ms,end_ms\n"
UNSAFE = ("\x1b", "\x07", "\n", "\u202e")


def _lines() -> tuple[list[str], int]:
    """The example's lines (ends kept) and the index of its header."""
    lines = EXAMPLE.read_text(encoding="utf-8").splitlines(keepends=True)
    return lines, next(i for i, line in enumerate(lines) if not line.startswith("#"))


def _with_first_row(tmp_path: Path, edit) -> tuple[Path, int]:
    """The example with its first data row's cells edited by `edit(cells)`; (path, that row's line)."""
    lines, header = _lines()
    cells = next(csv.reader([lines[header + 1]]))
    edit(cells)
    row = ",".join('"' + c.replace('"', '""') + '"' for c in cells) + "\n"
    path = tmp_path / "hostile.csv"
    path.write_text("".join(lines[:header + 1] + [row] + lines[header + 2:]), encoding="utf-8")
    return path, header + 2


def _one_line(e: pytest.ExceptionInfo) -> str:
    text = e.value.one_line()
    assert "\n" not in text and not any(ch in text for ch in UNSAFE), text
    return text


def test_the_example_profile_reads() -> None:
    assert load_profile(EXAMPLE).n_layers == 8  # the file every test below makes hostile


def test_a_profile_cell_past_the_field_limit_is_one_error_at_its_line(tmp_path: Path) -> None:
    path, line = _with_first_row(tmp_path, lambda cells: cells.__setitem__(1, "x" * 200_000))
    with pytest.raises(ProfileError) as e:
        load_profile(path)
    assert f"{path}:{line}: a cell is longer than" in _one_line(e)


def test_an_unclosed_quote_is_refused_where_the_cell_outgrows_the_limit(tmp_path: Path) -> None:
    lines, header = _lines()
    path = tmp_path / "quote.csv"
    path.write_text("".join(lines[:header + 1] + ['0,"fc0\n'] + lines[header + 2:] * 40), encoding="utf-8")
    with pytest.raises(ProfileError, match=r"quote\.csv:\d+: a cell is longer than .*never closed"):
        load_profile(path)


def test_a_megabyte_comment_line_is_refused_before_it_is_split(tmp_path: Path) -> None:
    text = EXAMPLE.read_text(encoding="utf-8")
    path = tmp_path / "long.csv"
    path.write_text(text.replace("\n", "\n#" + "c" * MAX_LINE_CHARS + "\n", 1), encoding="utf-8")
    with pytest.raises(ProfileError) as e:
        load_profile(path)
    assert f"{path}:2: line is longer than {MAX_LINE_CHARS:,} bytes" in _one_line(e)  # checked before decoding
    path.write_bytes(text.replace("\n", "\r").replace("\r", "\r#" + "c" * MAX_LINE_CHARS + "\r", 1).encode())
    with pytest.raises(ProfileError) as e:
        load_profile(path)
    assert f"{path}:2: line is longer than" in _one_line(e)  # a \r-only file counts its lines too
    path.write_text(text.replace("\n", "\n#" + "c" * (MAX_LINE_CHARS - 1) + "\r\n", 1), encoding="utf-8")
    assert load_profile(path).n_layers == 8  # a line of exactly the limit is read


@pytest.mark.parametrize("kind", [str, bytes])
def test_line_lengths_are_checked_in_any_window(kind) -> None:
    """The check moves by whole windows: a long line far into the text, after short ones of
    every line ending, is found and named by its line."""
    short = "ab\n" * 1000 + "cd\r\n" * 1000 + "ef\r" * 1000
    text = short + "g" * (MAX_LINE_CHARS + 1) + "\n"
    as_kind = (lambda s: s) if kind is str else (lambda s: s.encode())
    check_line_lengths(as_kind(short + "g" * MAX_LINE_CHARS), "t", ProfileError)
    with pytest.raises(ProfileError, match=f"^t:{2001}: line is longer"):
        check_line_lengths(as_kind(text), "t", ProfileError)


def test_lines_are_counted_as_splitlines_makes_them() -> None:
    for text in ["", "a", "a\nb\n", "a\r\nb\r\n", "a\rb\rc", "a\x0cb\u2028c\x85d\n"]:
        assert count_lines(text) >= len(text.splitlines()) and count_lines(text) <= len(text.splitlines()) + 1, repr(text)
    assert count_lines("\r" * 3_000_000) == 3_000_001


def test_a_profile_of_millions_of_carriage_returns_is_refused_before_splitting() -> None:
    from planner.profiling.profile import read_profile_text

    with pytest.raises(ProfileError, match="3000001 lines, more than any profile has"):
        read_profile_text("\r" * 3_000_000, "cr.csv")


@pytest.mark.parametrize("bad", ["\x1b]0;title\x07", "a\nb", "ab\u202ecd"])
def test_a_layer_name_with_control_characters_is_refused_at_its_line(tmp_path: Path, bad: str) -> None:
    path, line = _with_first_row(tmp_path, lambda cells: cells.__setitem__(1, "fc0" + bad))
    with pytest.raises(ProfileError) as e:
        load_profile(path)
    text = _one_line(e)
    assert "layer name" in text and "control character" in text
    assert f"{path}:{line + bad.count(chr(10))}:" in text  # the line the row ends on


def test_a_metadata_value_with_an_escape_sequence_is_refused(tmp_path: Path) -> None:
    lines, _ = _lines()
    path = tmp_path / "meta.csv"
    # whichever machine measured the example, its device name becomes one that clears the screen
    path.write_text("".join("# device_name: AMD\x1b[2J EPYC\n" if line.startswith("# device_name:") else line
                            for line in lines), encoding="utf-8")
    with pytest.raises(ProfileError) as e:
        load_profile(path)
    assert "meta.csv:5: metadata 'device_name'" in _one_line(e)


def test_a_long_metadata_value_without_control_characters_reads(tmp_path: Path) -> None:
    lines, _ = _lines()
    command = "pplan profile " + " ".join(f"--opt{i} value{i}" for i in range(80))  # ~1,300 characters
    path = tmp_path / "meta.csv"
    path.write_text("".join(line if not line.startswith("# command:") else f"# command: {command}\n" for line in lines),
                    encoding="utf-8")
    assert load_profile(path).meta["command"] == command


@pytest.mark.parametrize("column,value,fragment", [
    (3, "1e400", "'1e400' is not a finite number"),
    (3, "NaN", "'NaN' is not a finite number"),
    (3, "9" * 300, "is too large for any real device"),
    (0, "9" * 300, "is too long for an integer"),
    (2, "1" + "0" * 300, "is too long for an integer"),
])
def test_huge_and_undefined_numbers_are_refused_with_the_cell_cut(tmp_path: Path, column: int, value: str, fragment: str) -> None:
    path, line = _with_first_row(tmp_path, lambda cells: cells.__setitem__(column, value))
    with pytest.raises(ProfileError) as e:
        load_profile(path)
    text = _one_line(e)
    assert f":{line}: column" in text and fragment in text and "9" * 60 not in text and "0" * 60 not in text


def test_a_header_only_timeline_is_refused_with_how_to_make_one(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("# made by hand\n" + HEADER + "# no rows\n", encoding="utf-8")
    with pytest.raises(PplanError) as e:
        read_timeline(path)
    assert "the timeline has no rows" in _one_line(e) and "pplan simulate PLAN --timeline FILE" in e.value.one_line()


def test_a_header_only_timeline_fails_the_report_with_exit_2(run_cli, tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(HEADER, encoding="utf-8")
    result = run_cli("report", "--timeline", path, "--out", tmp_path / "report")
    assert result.returncode == 2 and "the timeline has no rows" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "report").exists()


@pytest.mark.parametrize("row,fragment", [
    ("0,0,F,0,0," + "1" * 200_000, "t.csv:2: a cell is longer than"),
    ('0,0,"F\x1b]0;x\x07",0,0,1', "t.csv:2: kind F\\x1b]0;x\\x07 holds the control character \\x1b"),
    ('0,0,"F\nB",0,0,1', "t.csv:3: kind"),
    ("0,0,F\u202e,0,0,1", "control character \\u202e"),
    ("1" + "0" * 300 + ",0,F,0,0,1", "column 'device': '1000000000000000000000000000000000000000' is not an integer"),
    ("0,0,F,0,0,1e400", "column 'end_ms': '1e400' is not finite"),
    ("0,0,F,0,nan,1", "column 'start_ms': 'nan' is not finite"),
])
def test_hostile_timeline_rows_are_one_line_errors(row: str, fragment: str) -> None:
    with pytest.raises(PplanError) as e:
        read_timeline_text(HEADER + row + "\n", "t.csv")
    assert fragment in _one_line(e)


def test_a_megabyte_timeline_line_and_millions_of_blank_lines_are_refused() -> None:
    with pytest.raises(PplanError, match="t.csv:2: line is longer than"):
        read_timeline_text(HEADER + "#" * (MAX_LINE_CHARS + 1) + "\n0,0,F,0,0,1\n", "t.csv")
    with pytest.raises(PplanError, match="lines, more than any timeline has"):
        read_timeline_text(HEADER + "\r" * 2_100_000, "t.csv")
