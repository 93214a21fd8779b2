"""`pplan simulate` end to end (subprocesses: exit codes, files, start-up imports)."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).parent.parent


def _pplan(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.app", *args], capture_output=True, text=True,
                          cwd=cwd or ROOT, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


@pytest.fixture()
def work(tmp_path: Path) -> Path:
    shutil.copy(DATA / "sim_plan.json", tmp_path / "plan.json")
    shutil.copy(DATA / "sim_profile.csv", tmp_path / "sim_profile.csv")
    return tmp_path


def test_human_output_and_files(work: Path) -> None:
    r = _pplan("simulate", str(work / "plan.json"), "--out", str(work / "sim.json"),
               "--timeline", str(work / "t.csv"), "--plot", str(work / "g.png"))
    assert r.returncode == 0, r.stderr
    assert "iteration" in r.stdout and "bubble" in r.stdout and "gpu2" in r.stdout
    sim = json.loads((work / "sim.json").read_text())
    assert sim["schedule"] == "1f1b" and sim["n_microbatches"] == 8 and len(sim["devices"]) == 3
    assert sim["devices"][1]["memory"]["total"] == sim["devices"][1]["peak_memory_bytes"]
    with open(work / "t.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["device", "stage", "kind", "microbatch", "start_ms", "end_ms"]
    assert {r["kind"] for r in rows} == {"F", "B", "R", "C", "O"}  # stage 1 recomputes layer 3
    assert max(float(r["end_ms"]) for r in rows) == pytest.approx(sim["iteration_ms"], abs=1e-5)
    from planner.report.style import KIND_COLORS
    from test_run_support import assert_drawn_png

    # the Gantt chart decodes and shows the kinds the timeline has (stage 1 recomputes: R)
    assert_drawn_png(work / "g.png", colors=tuple(KIND_COLORS[k] for k in ("F", "B", "R")))


def test_json_and_what_if_flags(work: Path) -> None:
    base = json.loads(_pplan("simulate", str(work / "plan.json"), "--json").stdout)
    more = json.loads(_pplan("simulate", str(work / "plan.json"), "--json", "--microbatches", "16").stdout)
    assert more["n_microbatches"] == 16 and more["micro_batch_size"] == 4  # size kept, global batch doubles
    assert more["bubble_fraction"] < base["bubble_fraction"]
    slow = json.loads(_pplan("simulate", str(work / "plan.json"), "--json", "--bandwidth", "10MB/s", "--latency", "1ms").stdout)
    assert slow["iteration_ms"] > base["iteration_ms"] + 10
    zb = json.loads(_pplan("simulate", str(work / "plan.json"), "--json", "--schedule", "zb").stdout)
    assert zb["schedule"] == "zb" and zb["iteration_ms"] < base["iteration_ms"]
    interp = _pplan("simulate", str(work / "plan.json"), "--micro-batch-size", "3")
    assert interp.returncode == 0 and "interpolated" in interp.stdout


def test_sweep_table_json_and_plot(work: Path) -> None:
    r = _pplan("simulate", str(work / "plan.json"), "--sweep", "microbatches=1,3,6,12", "--plot", str(work / "s.png"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "cannot run" in lines[1]  # 1f1b needs at least 3 micro-batches on 3 devices
    assert len(lines) == 5
    from test_run_support import assert_drawn_png

    assert_drawn_png(work / "s.png")
    data = json.loads(_pplan("simulate", str(work / "plan.json"), "--sweep", "schedule=gpipe,1f1b,zb,interleaved", "--json").stdout)
    by = {row["value"]: row for row in data["rows"]}
    assert by["gpipe"]["iteration_ms"] == pytest.approx(by["1f1b"]["iteration_ms"], rel=0.05)
    assert by["zb"]["iteration_ms"] < by["1f1b"]["iteration_ms"]
    assert by["interleaved"]["error"] and by["gpipe"]["peak_memory_bytes"] > by["1f1b"]["peak_memory_bytes"]


@pytest.mark.parametrize("args", [
    ["--schedule", "1f1b", "--microbatches", "2"],
    ["--schedule", "interleaved"],
    ["--bandwidth", "fast"],
    ["--sweep", "layers=1,2"],
    ["--profile", "missing.csv"],
    ["--plot", "g.txt"],
])
def test_errors_are_one_line_exit_2_and_leave_no_files(work: Path, args: list[str]) -> None:
    out = ["--out", str(work / "o.json"), "--timeline", str(work / "o.csv")]
    r = _pplan("simulate", str(work / "plan.json"), *out, *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.startswith("pplan: error: ") and r.stderr.count("\n") == 1
    assert sorted(p.name for p in work.iterdir()) == ["plan.json", "sim_profile.csv"]


def test_simulate_imports_neither_torch_nor_matplotlib(work: Path) -> None:
    code = (
        "import sys\n"
        "from cli.app import main\n"
        f"sys.argv = ['pplan', 'simulate', {str(work / 'plan.json')!r}, '--json']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('HEAVY', sorted(m for m in ('torch', 'matplotlib') if m in sys.modules))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "HEAVY []" in r.stdout
