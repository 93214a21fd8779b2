"""What `pplan bench` writes and prints: the published table's error in percent, and the default
output folder kept out of the committed reports/bench/ (cli/cmd_bench.py, planner/bench/published.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

import planner.bench.published as published
from cli.cmd_bench import BENCH_DEFAULT_DIR
from planner.bench.table import column, table_csv, table_text

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class _Config:
    dp: int
    pp: int
    tp: int


@dataclass(frozen=True)
class _Best:
    """The fields of a ParallelResult's best plan that published_table reads."""

    tflops_per_gpu: float
    config: _Config
    schedule_label: str = "1f1b"
    micro_batch_size: int = 1
    peak_memory_bytes: int = 2**30


@dataclass(frozen=True)
class _Result:
    best: _Best


def _fake_predict(run, auto=False, compute_scale=None):
    """Every run predicted at 0.94x its published figure (-6%), the auto layout at 0.95x: the
    3-D search is not what these tests are about, and it takes seconds per row."""
    factor = 0.95 if auto else 0.94
    return _Result(_Best(run.tflops_per_gpu * factor, _Config(run.dp, run.pp, run.tp)))


@pytest.fixture
def table(monkeypatch):
    monkeypatch.setattr(published, "predict", _fake_predict)
    return published.published_table()


def test_published_error_is_a_percent_of_the_published_figure(table) -> None:
    errors = column(table, published.ERROR_COLUMN)
    assert published.ERROR_COLUMN == "error %" and "error" not in table.columns
    assert errors == [pytest.approx(-6.0, abs=1e-9)] * len(published.PUBLISHED_RUNS)


def test_published_summary_keeps_fractions_and_adds_percents(table) -> None:
    s = table.summary
    assert s["mean_abs_error"] == pytest.approx(0.06) and s["max_abs_error"] == pytest.approx(0.06)
    assert s["mean_abs_error_pct"] == pytest.approx(6.0) and s["max_abs_error_pct"] == pytest.approx(6.0)


def test_published_text_prints_percents_and_the_mean(table) -> None:
    text = table_text(table)
    assert "error %" in text.splitlines()[1]
    assert " -6 " in text.splitlines()[2] + " "  # the first row's cell: -6, not -0.06
    assert "Mean |error| 6.0%, worst -6.0% (megatron-" in text and f"tolerance {100 * published.TOLERANCE:.0f}%." in text  # rows tie: any may be named
    assert ",-6.0" in table_csv(table, {"date": "x"})  # the CSV holds the same (unrounded) percent


def test_published_notes_name_the_worst_row(monkeypatch) -> None:
    def one_bad(run, auto=False, compute_scale=None):
        factor = 1.125 if run.name == "bloom-176B" else 0.99
        return _Result(_Best(run.tflops_per_gpu * factor, _Config(run.dp, run.pp, run.tp)))

    monkeypatch.setattr(published, "predict", one_bad)
    t = published.published_table(auto=False)
    assert "worst +12.5% (bloom-176B)" in t.notes[-1]
    assert t.summary["max_abs_error_pct"] == pytest.approx(12.5)


def test_default_bench_folder_is_ignored_and_not_the_committed_one() -> None:
    ignored = [ln.strip() for ln in (ROOT / ".gitignore").read_text().splitlines()]
    assert f"{BENCH_DEFAULT_DIR.as_posix()}/" in ignored and BENCH_DEFAULT_DIR != Path("reports/bench")
    assert not any(ln.rstrip("/") in ("reports", "reports/bench", "reports/*") for ln in ignored)


def test_bench_without_out_dir_writes_the_untracked_folder(pplan, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, _out, err = pplan("bench", "simulator", "--sizes", "4x8", "--repeats", "1")
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "reports" / "bench-latest").iterdir()) == ["simulator.csv", "simulator.md"]
    assert not (tmp_path / "reports" / "bench").exists()


def test_committed_reports_show_percent_errors() -> None:
    md = (ROOT / "reports" / "bench" / "published.md").read_text()
    assert "| error % |" in md and "Mean |error|" in md
