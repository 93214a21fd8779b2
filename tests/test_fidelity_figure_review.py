"""`pplan bench fidelity`'s figure and terminal table, from the committed reports/bench/fidelity.csv
and hand-made tables (no bench runs): the figure says what its bars are, writes ±10%, names the
machine and labels its log axes with plain numbers in the report style; the terminal prints the
columns read first and says where every column is, while the files keep them all."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from planner.bench.fidelity import COLUMNS, TERMINAL_COLUMNS, fidelity_figure, redraw_fidelity_figure
from planner.bench.table import Table, read_table_csv, table_csv, table_text
from planner.errors import PplanError

COMMITTED = Path(__file__).resolve().parents[1] / "reports" / "bench" / "fidelity.csv"
MACHINE = {"date": "2026-01-02T03:04:05Z", "cpu": "Test CPU 9000", "cores": 2, "ram_gib": 23.5, "load_1min": 1.0,
           "os": "Linux 6.1", "python": "3.11.7", "torch": "2.3+cpu", "numpy": "2.0", "pulp": "3.3.2", "ilp_solver": "CBC"}


def _row(model: str, pred: float, meas: float, lo: float, hi: float, repeats: int = 4) -> tuple[Any, ...]:
    values = dict.fromkeys(COLUMNS)
    values.update(model=model, devices=2, schedule="gpipe", microbatches=4, predicted_ms=pred, measured_ms=meas,
                  time_err_pct=100 * (pred - meas) / meas, mem_abs_err_pct=0.5, measured_ms_min=lo, measured_ms_max=hi,
                  err_spread_pct=3.0, repeats=repeats, basis="simulate(profile + machine, 2 ranks)")
    return tuple(values[c] for c in COLUMNS)


def _table(rows: tuple[tuple[Any, ...], ...]) -> Table:
    return Table(name="fidelity", title="Fidelity", columns=COLUMNS, rows=rows, notes=("a note",),
                 terminal_columns=TERMINAL_COLUMNS)


@pytest.fixture
def drawn(monkeypatch) -> list[Any]:
    """The matplotlib Figures fidelity_figure renders (a stand-in PNG is written)."""
    pytest.importorskip("matplotlib")
    import planner.report.style

    figures: list[Any] = []

    def keep(fig: Any, fmt: str, dpi: int = 150) -> bytes:
        figures.append(fig)
        return b"\x89PNG stand-in"

    monkeypatch.setattr(planner.report.style, "render", keep)
    return figures


def _texts(fig: Any) -> str:
    from matplotlib.text import Text

    return "\n".join(t.get_text() for t in fig.findobj(Text))


def test_the_figure_says_its_bars_are_the_min_max_names_the_machine_and_writes_plus_minus(tmp_path, drawn) -> None:
    table = _table((_row("gpt", 100.0, 110.0, 105.0, 120.0), _row("synthetic", 700.0, 690.0, 680.0, 700.0)))
    fidelity_figure(table, str(tmp_path / "f.png"), MACHINE)
    text = _texts(drawn[0])
    assert "min-max of measured step time" in text and "median of 4 runs" in text
    assert "±10%" in text and "+-" not in text
    assert "Test CPU 9000 (2 cores, 23.5 GiB RAM" in text and "torch 2.3+cpu" in text


def test_the_figure_labels_its_log_axes_with_plain_numbers_in_the_report_style(tmp_path, drawn) -> None:
    table = _table((_row("gpt", 60.0, 70.0, 65.0, 75.0), _row("mlp", 3000.0, 2900.0, 2800.0, 3100.0)))
    fidelity_figure(table, str(tmp_path / "f.png"), MACHINE)
    ax = drawn[0].axes[0]
    lo, hi = ax.get_xlim()
    ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
    assert {50, 100, 200, 500, 1000, 2000} <= {round(t) for t in ticks}
    assert [ax.xaxis.get_major_formatter()(v, 0) for v in (200, 1000)] == ["200", "1,000"]
    assert not ax.spines["top"].get_visible()  # planner.report.style's look, as the report figures


def test_a_narrow_range_still_gets_labelled_ticks(tmp_path, drawn) -> None:
    fidelity_figure(_table((_row("synthetic", 30.0, 31.0, 30.5, 31.5),)), str(tmp_path / "f.png"), MACHINE)
    ax = drawn[0].axes[0]
    lo, hi = ax.get_ylim()
    assert len([t for t in ax.get_yticks() if lo <= t <= hi]) >= 3


def test_one_run_per_case_draws_no_bars_and_says_so(tmp_path, drawn) -> None:
    fidelity_figure(_table((_row("gpt", 100.0, 110.0, 110.0, 110.0, repeats=1),)), str(tmp_path / "f.png"), MACHINE)
    assert "One run per case: no bars." in _texts(drawn[0])


def test_the_committed_figure_redraws_from_its_csv_with_the_csv_machine(tmp_path, drawn) -> None:
    redraw_fidelity_figure(str(COMMITTED), str(tmp_path / "f.png"))
    _table_read, machine = read_table_csv(COMMITTED, "fidelity", "")
    text = _texts(drawn[0])
    assert machine["cpu"] in text and machine["date"] in text and "min-max" in text


def test_the_csv_reads_back_as_written(tmp_path) -> None:
    table = _table((_row("gpt", 100.123456789, 110.0, 105.0, 120.0), _row("mlp", 1.0, 2.0, 1.5, 2.5)))
    path = tmp_path / "fidelity.csv"
    path.write_text(table_csv(table, MACHINE), encoding="utf-8")
    back, machine = read_table_csv(path, "fidelity", "Fidelity")
    assert back.columns == table.columns and back.rows == table.rows
    assert machine == {k: str(v) for k, v in MACHINE.items()}


def test_the_committed_csv_has_every_column_and_prints_narrow() -> None:
    table, _machine = read_table_csv(COMMITTED, "fidelity", "Fidelity")
    assert table.columns == COLUMNS
    table = dataclasses.replace(table, terminal_columns=TERMINAL_COLUMNS)
    full = table_text(table).splitlines()[1:]
    short = table_text(table, table.terminal_columns).splitlines()[1:]
    assert max(map(len, full)) > 300  # every column: what the terminal printed before (376 characters)
    assert len(short) == len(table.rows) + 1 and max(map(len, short)) < 160
    assert short[0].split() == list(TERMINAL_COLUMNS)


def test_pplan_bench_fidelity_prints_the_short_table_and_writes_every_column(tmp_path, pplan, monkeypatch) -> None:
    pytest.importorskip("matplotlib")
    import planner.bench

    committed, _machine = read_table_csv(COMMITTED, "fidelity", "Fidelity")
    monkeypatch.setattr(planner.bench, "bench_fidelity",
                        lambda grid, **_kw: dataclasses.replace(committed, terminal_columns=TERMINAL_COLUMNS))
    out = tmp_path / "bench"
    code, stdout, err = pplan("bench", "fidelity", "--quick", "--out-dir", out)
    assert code == 0, err
    lines = stdout.splitlines()
    table_lines = [line for line in lines[1:] if line and not line.startswith("note:")]
    assert len(table_lines) == len(committed.rows) + 1 and max(map(len, table_lines)) < 160
    assert f"note: {len(TERMINAL_COLUMNS)} of {len(COLUMNS)} columns shown; every column is in {out / 'fidelity.csv'} " \
           f"and {out / 'fidelity.md'} (and --json)." in lines
    written, _ = read_table_csv(out / "fidelity.csv", "fidelity", "")
    assert written.columns == COLUMNS and written.rows == committed.rows
    assert "| mem_worst_err_pct |" in (out / "fidelity.md").read_text(encoding="utf-8")

    code, stdout, err = pplan("bench", "fidelity", "--quick", "--json", "--out-dir", out)
    assert code == 0, err
    assert json.loads(stdout)["tables"][0]["columns"] == list(COLUMNS)


def test_other_tables_print_every_column() -> None:
    table = Table(name="t", title="T", columns=("a", "b"), rows=((1, 2.5),))
    assert table_text(table).splitlines()[1].split() == ["a", "b"]


def test_a_bench_csv_is_read_bounded_and_its_numbers_plain(tmp_path: Path) -> None:
    """'1_0' and fullwidth digits stay text (int() would read 10); a file beyond the bound is refused unread."""
    path = tmp_path / "t.csv"
    path.write_text("# host: h\nmodel,devices,ms\ngpt,1_0,\uff11\nmlp,4,2.5\n")
    table, machine = read_table_csv(path, "t", "")
    assert machine == {"host": "h"} and table.rows == (("gpt", "1_0", "\uff11"), ("mlp", 4, 2.5))
    with open(tmp_path / "big.csv", "wb") as fh:
        fh.truncate(2**27)
    with pytest.raises(PplanError, match="more than the"):
        read_table_csv(tmp_path / "big.csv", "t", "")
