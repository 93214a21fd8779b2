"""`pplan bench handover`: the quick bench's table and files (times are printed, never asserted)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from planner.bench.handover import COLUMNS, QUICK, HandoverSettings, bench_handover
from planner.bench.table import column
from planner.errors import RunError

from helpers.cli import run_pplan, start_pplan

_TIMES = ("median_ms", "mean_ms", "p95_ms", "max_ms", "wait_mean_ms")


def _check_table(table: dict) -> None:
    assert tuple(table["columns"]) == COLUMNS
    rows = [dict(zip(table["columns"], r)) for r in table["rows"]]
    keys = [(r["mode"], r["direction"], r["size_kib"]) for r in rows]
    want = [(m, d, n // 1024) for m in ("idle", "compute") for n in QUICK.sizes_bytes for d in ("uni", "bidir")]
    assert sorted(keys) == sorted(want) and len(keys) == len(set(keys))
    for r in rows:
        assert r["samples"] == 2 * QUICK.reps  # both ranks' samples, pooled
        assert 0.0 <= r["over_1ms_pct"] <= 100.0
        if r["mode"] == "idle":
            assert all(r[k] >= 0.0 and math.isfinite(r[k]) for k in ("median_ms", "mean_ms", "p95_ms", "max_ms"))
            assert r["max_ms"] >= r["p95_ms"] >= 0.0 and r["max_ms"] >= r["median_ms"]
            assert r["work_ms"] is None and r["wait_mean_ms"] is None and r["off_cpu_mean_ms"] is None
        else:
            # the extra is a difference against the work alone: finite, not necessarily positive
            assert r["work_ms"] > 0.0 and r["wait_mean_ms"] >= 0.0
            assert all(math.isfinite(r[k]) for k in (*_TIMES, "off_cpu_mean_ms"))
            assert r["max_ms"] >= r["p95_ms"] and r["max_ms"] >= r["median_ms"]


@pytest.mark.slow  # two torch processes over gloo
def test_quick_bench_has_one_row_per_mode_direction_and_size() -> None:
    table = bench_handover(QUICK)
    _check_table(table.as_dict())
    assert table.name == "handover" and column(table, "mode").count("compute") == 2 * len(QUICK.sizes_bytes)
    notes = " ".join(table.notes)
    assert "Hypothesis" in notes and "Load average" in notes
    assert table.summary["work_matmuls"] >= 1


@pytest.mark.slow
def test_cli_writes_csv_and_markdown(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    got = run_pplan("bench", "handover", "--quick", "--out-dir", str(out), "--json", cwd=tmp_path, timeout=300)
    assert got.returncode == 0, got.stderr
    data = json.loads(got.stdout)
    _check_table(data["tables"][0])
    assert sorted(p.name for p in out.iterdir()) == ["handover.csv", "handover.md"]
    assert "mode,direction,size_kib" in (out / "handover.csv").read_text()
    assert "[bench] handover:" in got.stderr


def test_a_rank_that_cannot_start_is_reported_and_both_are_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # an interpreter that exits at once stands in for a rank that fails: the bench must name it and return
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'ImportError: no torch here' >&2\nexit 7\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake))
    with pytest.raises(RunError, match=r"rank \d exited with code 7: ImportError: no torch here"):
        bench_handover(HandoverSettings(sizes_bytes=(1024,), reps=1, warmup=0, timeout_s=60.0))


def test_a_hung_rank_hits_the_deadline_and_is_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "python"
    pids = tmp_path / "pids"
    fake.write_text(f"#!/bin/sh\necho $$ >> {pids}\nexec sleep 600\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake))
    with pytest.raises(RunError, match="did not finish within 1 s"):
        bench_handover(HandoverSettings(sizes_bytes=(1024,), reps=1, warmup=0, timeout_s=1.0))
    for pid in map(int, pids.read_text().split()):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def _children(pid: int) -> list[int]:
    """Live processes whose parent is `pid`, from /proc (no psutil)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.slow
def test_ctrl_c_stops_both_ranks_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    proc = start_pplan("bench", "handover", "--out-dir", str(out), cwd=tmp_path, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # the ranks report their first cell once both are measuring
            if "handover: uni" in line:
                break
        ranks = _children(proc.pid)
        assert len(ranks) == 2
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 130
    deadline = time.monotonic() + 5.0
    while any(_alive(r) for r in ranks) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(r) for r in ranks)
    assert not out.exists() or not any(out.iterdir())
