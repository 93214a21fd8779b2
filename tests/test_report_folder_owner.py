"""`pplan report --out DIR` writes only into a folder that is new, empty, free of the report's own
names, or a previous pplan report: someone's figures/ or report.md in DIR is refused, never replaced."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from planner.errors import PplanError
from planner.report.document import (
    FigureEntry, ReportDocument, check_replaceable, render_html, render_markdown, write_report_folder,
)

REPO = Path(__file__).resolve().parent.parent
PLAN = Path(__file__).parent / "data" / "report" / "plan.json"


def _write(out: Path, figures: dict[str, bytes]) -> Path:
    """A small report (no drawing): the given figure files and the index naming them."""
    entries = tuple(FigureEntry(i + 1, name.split(".")[0], "t", "c", (f"figures/{name}",))
                    for i, name in enumerate(sorted(figures)))
    doc = ReportDocument(title="t", inputs=(("plan", "plan.json"),), summary=(), figures=entries)
    return write_report_folder(out, figures, render_markdown(doc), render_html(doc))


def _refused(out: Path, *words: str) -> str:
    with pytest.raises(PplanError) as e:
        _write(out, {"1_schedule.png": b"new"})
    for word in words:
        assert word in e.value.message, e.value.message
    assert "give a new or empty folder" in (e.value.hint or "")
    return e.value.message


def test_a_users_figures_folder_is_refused_and_kept(tmp_path):
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "important.txt").write_text("keep")
    _refused(tmp_path, "figures/'important.txt' is not a figure pplan wrote")
    assert (tmp_path / "figures" / "important.txt").read_text() == "keep"
    assert sorted(os.listdir(tmp_path)) == ["figures"]  # no index written, no temporary folder left


@pytest.mark.parametrize("name", ["report.md", "report.html"])
def test_a_users_index_file_is_refused_and_kept(tmp_path, name):
    (tmp_path / name).write_text("mine")
    _refused(tmp_path, f"holds a {name} that is not a pplan report")
    assert (tmp_path / name).read_text() == "mine"
    assert not (tmp_path / "figures").exists()


def test_a_figures_link_is_refused_and_its_target_kept(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "1_schedule.png").write_bytes(b"theirs")
    out = tmp_path / "out"
    out.mkdir()
    (out / "figures").symlink_to(target)
    _refused(out, "figures/ is not a folder pplan wrote")
    assert (target / "1_schedule.png").read_bytes() == b"theirs"


def test_a_fifo_named_report_md_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "report.md")
    _refused(tmp_path, "holds a report.md that is not a pplan report")


def test_a_previous_pplan_report_is_replaced(tmp_path):
    _write(tmp_path, {"1_schedule.png": b"old", "2_memory.svg": b"old"})
    _write(tmp_path, {"1_schedule.png": b"new"})
    assert sorted(os.listdir(tmp_path / "figures")) == ["1_schedule.png"]
    assert (tmp_path / "figures" / "1_schedule.png").read_bytes() == b"new"


def test_other_files_in_the_folder_are_left_alone(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "data").mkdir()
    _write(tmp_path, {"4_baselines.png": b"x"})
    assert (tmp_path / "notes.txt").read_text() == "mine" and (tmp_path / "data").is_dir()
    assert (tmp_path / "report.md").exists() and (tmp_path / "report.html").exists()


def test_the_committed_example_report_is_recognised_as_pplans():
    check_replaceable(REPO / "reports" / "example")  # regenerating it (docs/report.md) must keep working


def test_pplan_report_refuses_a_users_folder_on_one_line_and_regenerates_its_own(tmp_path, run_cli):
    out = tmp_path / "v"
    (out / "figures").mkdir(parents=True)
    (out / "figures" / "important.txt").write_text("keep")
    (out / "report.md").write_text("mine")
    res = run_cli("report", "--plan", PLAN, "--out", out, "--formats", "png", "--no-simulate")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"pplan: error: report folder {str(out)!r} holds a report.md"), lines
    assert (out / "report.md").read_text() == "mine" and (out / "figures" / "important.txt").read_text() == "keep"
    mine = tmp_path / "mine"
    for _ in range(2):  # a report pplan wrote is written again
        res = run_cli("report", "--plan", PLAN, "--out", mine, "--formats", "png", "--no-simulate")
        assert res.returncode == 0, res.stderr
    assert (mine / "report.md").exists() and sorted(os.listdir(mine / "figures"))
