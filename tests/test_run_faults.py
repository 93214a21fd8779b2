"""A rank that dies or hangs ends `pplan run`, naming it, with no process left (slow).

Outcomes only (exit code, the one error line, no rank left): how fast the run ends depends on
the machine's load, so the timeouts here are generous guards against hanging forever, never
the thing tested.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from helpers.cli import start_pplan
from helpers.plans import synthetic_spec, write_plan
from helpers.ranks import alive, rank_pids

HANG_GUARD_S = 180  # far beyond any healthy ending (see the module docstring)


def _start(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, list[str], threading.Thread]:
    plan = write_plan(tmp_path / "plan.json", synthetic_spec(2, fwd_ms=50, bwd_ms=100), "1f1b", 2,
                      [(0, 1), (1, 2)], n_microbatches=2)
    proc = start_pplan("run", plan, "--device", "cpu", "--steps", "200", *extra, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    deadline = time.monotonic() + HANG_GUARD_S  # a guard against hanging, not a speed test
    while not any("step 1/" in ln for ln in lines):
        assert proc.poll() is None, "".join(lines)
        assert time.monotonic() < deadline, f"the run did not start within {HANG_GUARD_S} s"
        time.sleep(0.1)
    return proc, lines, reader


def _finish(proc: subprocess.Popen, lines: list[str], reader: threading.Thread, ranks: dict[int, int]) -> str:
    try:
        proc.wait(timeout=HANG_GUARD_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        for pid in ranks:
            os.kill(pid, signal.SIGKILL)
        pytest.fail(f"pplan run hung: still running after {HANG_GUARD_S} s")
    # the launcher waits for every rank it ended before it exits: none may be left, not even briefly
    assert [pid for pid in ranks if alive(pid)] == []
    reader.join(timeout=HANG_GUARD_S)  # every line the launcher wrote, up to end of file
    assert not reader.is_alive(), "stderr still open after the launcher exited"
    return "".join(lines)


@pytest.mark.slow
def test_a_killed_rank_ends_the_run_naming_the_rank(tmp_path):
    proc, lines, reader = _start(tmp_path)
    ranks = {pid: r for r, pid in rank_pids(proc.pid).items()}
    assert sorted(ranks.values()) == [0, 1]
    victim = next(pid for pid, r in ranks.items() if r == 1)
    os.kill(victim, signal.SIGKILL)
    err = _finish(proc, lines, reader, ranks)
    assert proc.returncode == 1
    msg = [ln for ln in err.splitlines() if ln.startswith("pplan: error:")]
    assert len(msg) == 1 and "rank 1 was killed by SIGKILL" in msg[0], err


@pytest.mark.slow
def test_a_hung_rank_fails_the_run_after_the_process_group_timeout(tmp_path):
    proc, lines, reader = _start(tmp_path, "--timeout", "4")
    ranks = {pid: r for r, pid in rank_pids(proc.pid).items()}
    victim = next(pid for pid, r in ranks.items() if r == 1)
    os.kill(victim, signal.SIGSTOP)  # alive but silent: only the timeout can tell
    try:
        err = _finish(proc, lines, reader, ranks)
    finally:
        if alive(victim):
            os.kill(victim, signal.SIGKILL)
    assert proc.returncode == 1  # RunError
    msg = [ln for ln in err.splitlines() if ln.startswith("pplan: error:")]
    # Two watchers race after --timeout: the launcher (rank 1 stopped too long) and rank 0's own
    # process-group timeout ("... then rank 0 failed ..."). Either way the stopped rank is named.
    assert len(msg) == 1 and "rank 1 stopped answering" in msg[0], err
