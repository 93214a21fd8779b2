"""`pplan bench` audit fixes: a planner grid without a cell is refused before anything runs and a
grid with unrunnable cells says so; an interrupted ILP solve leaves no solver files in the temp
folder; fidelity's --json lists its figure; the Markdown names the OS and PuLP; an empty item
in a list option is refused. Commands run in this process (conftest's `pplan`)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers.cli import one_error_line
from planner.bench.table import Table, machine_line, table_markdown
from planner.errors import PplanError


def test_a_planner_grid_without_a_cell_is_refused_before_anything_runs(tmp_path: Path, pplan, monkeypatch) -> None:
    import planner.bench.parallel_bench

    def never(**_kw):
        raise AssertionError("the 3D search ran")

    monkeypatch.setattr(planner.bench.parallel_bench, "bench_parallel", never)
    out = tmp_path / "bench"
    line = one_error_line(*pplan("bench", "planner", "--layers", "1000", "--devices", "4000", "--out-dir", out)[::2])
    assert "--layers 1000 and --devices 4000 make no cell" in line and "devices <= layers" in line, line
    assert not out.exists()


def test_the_library_refuses_a_grid_without_a_cell() -> None:
    from planner.bench import bench_planner

    with pytest.raises(PplanError, match=r"--layers 4,6 and --devices 8,10 make no cell"):
        bench_planner(layers=[6, 4], devices=[10, 8])


def test_a_grid_with_unrunnable_cells_names_them_in_its_notes() -> None:
    from planner.bench import bench_planner

    t = bench_planner(layers=[6], devices=[2, 8], ilp_time_limit=60)
    assert [(r[0], r[1]) for r in t.rows] == [(6, 2)]
    assert "ILP finished every cell." not in t.notes
    assert "ILP finished every cell in the table." in t.notes
    assert any(n.startswith("Not run: 1 layers x devices cell with more devices than layers") and n.endswith(": 6x8.")
               for n in t.notes), t.notes


@pytest.fixture
def temp_folder(tmp_path: Path, monkeypatch) -> Path:
    """The temp folder (TMPDIR) for this test, empty."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    for name in ("TMP", "TEMP"):  # PuLP reads TMP before TMPDIR
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() caches its first answer
    return folder


def _cbc_only() -> None:
    from planner.partition.ilp import ilp_solver_name

    if ilp_solver_name() != "CBC":
        pytest.skip("the solver is not CBC: it exchanges no files")


def test_an_interrupted_ilp_solve_leaves_no_files(temp_folder: Path, monkeypatch) -> None:
    _cbc_only()
    import pulp.apis.coin_api as coin_api

    from planner.bench.planner_bench import planner_problem
    from planner.partition.ilp import solve_ilp

    seen: list[str] = []

    class InterruptedCbc:
        """CBC started, then Ctrl-C while the solve waits for it."""

        def __init__(self, args, **_kw):
            seen.extend(str(p) for p in temp_folder.rglob("*-pulp.mps"))

        def wait(self):
            raise KeyboardInterrupt

    monkeypatch.setattr(coin_api, "subprocess", SimpleNamespace(Popen=InterruptedCbc))
    with pytest.raises(KeyboardInterrupt):
        solve_ilp(planner_problem(6, 2), time_limit=60)
    assert seen, "the model file was not written under the temp folder"
    assert list(temp_folder.iterdir()) == []


def test_an_interrupted_ilp_solve_stops_its_solver_process(temp_folder: Path, monkeypatch) -> None:
    """The solver process outlived pplan by up to its time limit after a SIGTERM: it is stopped."""
    _cbc_only()
    import subprocess
    import sys
    import time

    import pulp.apis.coin_api as coin_api

    from planner.bench.planner_bench import planner_problem
    from planner.partition.ilp import solve_ilp

    started: list[subprocess.Popen] = []

    class SlowCbc:
        """A process that sleeps with CBC's arguments (they name the model file); the solve is
        interrupted while it waits."""

        def __init__(self, args, **_kw):
            started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", *map(str, args)]))

        def wait(self):
            raise KeyboardInterrupt

    monkeypatch.setattr(coin_api, "subprocess", SimpleNamespace(Popen=SlowCbc))
    try:
        with pytest.raises(KeyboardInterrupt):
            solve_ilp(planner_problem(6, 2), time_limit=60)
        assert started
        deadline = time.monotonic() + 30
        while started[0].poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started[0].poll() is not None, "the solver process outlived the interrupted solve"
    finally:
        for p in started:
            if p.poll() is None:
                p.kill()
            p.wait()


def test_an_ilp_solve_leaves_no_files(temp_folder: Path) -> None:
    _cbc_only()
    from planner.bench.planner_bench import planner_problem
    from planner.partition.ilp import solve_ilp

    got = solve_ilp(planner_problem(6, 2), time_limit=60)
    assert got is not None and got.optimal
    assert list(temp_folder.iterdir()) == []


def _fidelity_table() -> Table:
    cols = ("model", "devices", "schedule", "microbatches", "predicted_ms", "measured_ms")
    return Table(name="fidelity", title="t", columns=cols, rows=(("gpt", 2, "gpipe", 4, 100.0, 110.0),))


def test_fidelity_json_lists_the_figure_with_the_tables(tmp_path: Path, pplan, monkeypatch) -> None:
    pytest.importorskip("matplotlib")
    import planner.bench

    monkeypatch.setattr(planner.bench, "bench_fidelity", lambda grid, **_kw: _fidelity_table())
    out = tmp_path / "bench"
    code, stdout, err = pplan("bench", "fidelity", "--quick", "--json", "--out-dir", out)
    assert code == 0, err
    files = json.loads(stdout)["files"]
    assert sorted(Path(f).name for f in files) == ["fidelity.csv", "fidelity.md", "fidelity.png"]
    assert all(Path(f).is_file() for f in files)


def test_a_figure_that_fails_leaves_no_table(tmp_path: Path, pplan, monkeypatch) -> None:
    import planner.bench
    import planner.bench.fidelity

    def broken(table, path, machine=None):
        raise PplanError("cannot draw the figure")

    monkeypatch.setattr(planner.bench, "bench_fidelity", lambda grid, **_kw: _fidelity_table())
    monkeypatch.setattr(planner.bench.fidelity, "fidelity_figure", broken)
    out = tmp_path / "bench"
    one_error_line(*pplan("bench", "fidelity", "--quick", "--out-dir", out)[::2])
    assert not out.exists() or list(out.iterdir()) == []


def test_the_markdown_machine_line_names_the_os_and_pulp() -> None:
    machine = {"date": "2026-01-01T00:00:00Z", "cpu": "AMD EPYC", "cores": 2, "ram_gib": 23.5, "load_1min": 1.0,
               "os": "Linux 6.1", "python": "3.11.7", "torch": "2.3", "numpy": "2.0", "pulp": "3.3.2", "ilp_solver": "CBC"}
    line = machine_line(machine)
    assert "Linux 6.1" in line and "PuLP 3.3.2" in line and "\n" not in line
    assert line in table_markdown(_fidelity_table(), machine).splitlines()


@pytest.mark.parametrize("args, what", [
    (["planner", "--layers", "20", "--devices", "4,,", "--no-parallel"], "--devices '4,,'"),
    (["planner", "--layers", ",20", "--devices", "2", "--no-parallel"], "--layers ',20'"),
    (["simulator", "--sizes", "8x64,"], "--sizes '8x64,'"),
    (["quality", "--devices", "2, ,4"], "--devices '2, ,4'"),
    (["fidelity", "--models", "gpt,,mlp"], "--models 'gpt,,mlp'"),
])
def test_an_empty_list_item_is_refused(tmp_path: Path, pplan, args: list[str], what: str) -> None:
    out = tmp_path / "bench"
    line = one_error_line(*pplan("bench", *args, "--out-dir", out)[::2])
    assert f"{what} has an empty item" in line, line
    assert not out.exists()
