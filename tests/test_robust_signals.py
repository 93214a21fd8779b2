"""Interrupting a command leaves nothing half-done; --debug shows what ordinary runs hide.

SIGINT reaches `pplan partition`, `simulate` and `profile` mid-run (after they have used some
CPU, or printed their first progress line): each must exit 130 without a traceback and leave
neither its output nor a temporary file. Interrupting or killing `pplan run` must
leave no rank process behind, found by scanning /proc (helpers/ranks.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers.cli import cli_env, run_pplan, start_pplan
from helpers.ranks import launcher_processes, rank_pids

ROOT = Path(__file__).resolve().parents[1]
BAD = ROOT / "tests" / "data" / "bad"
_CLK = os.sysconf("SC_CLK_TCK")


class _Proc:
    """A `python -m cli.app` subprocess whose stderr is collected line by line as it comes."""

    def __init__(self, args: list[str], cwd: Path):
        self.p = start_pplan(*args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
        self.lines: list[str] = []
        self._t = threading.Thread(target=self._pump, daemon=True)
        self._t.start()

    def _pump(self) -> None:
        assert self.p.stderr is not None
        for line in self.p.stderr:
            self.lines.append(line)

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    def wait_for_line(self, needle: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.p.poll() is None:
            if any(needle in ln for ln in self.lines):
                return True
            time.sleep(0.05)
        return any(needle in ln for ln in self.lines)

    def wait_for_cpu(self, seconds: float, timeout: float) -> bool:
        """Until the process has used `seconds` of CPU (imports done, real work under way)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.p.poll() is None:
            if _cpu_s(self.p.pid) >= seconds:
                return True
            time.sleep(0.05)
        return False

    def finish(self, timeout: float = 60) -> int:
        try:
            code = self.p.wait(timeout=timeout)
        finally:
            if self.p.poll() is None:
                self.p.kill()
                self.p.wait()
        self._t.join(timeout=5)
        if self.p.stdout is not None:
            self.p.stdout.close()
        return code


def _cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _CLK  # utime + stime


def _leftovers(folder: Path) -> list[str]:
    if not folder.exists():
        return []
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp") or p.name.startswith("."))


def _assert_interrupted(proc: _Proc, code: int, outputs: list[Path]) -> None:
    err = proc.stderr
    assert code == 130, f"exit code {code}, expected 130 (interrupted); stderr:\n{err}"
    assert "Traceback" not in err, err
    for out in outputs:
        assert not out.exists(), f"{out} was written although the command was interrupted"
        assert not _leftovers(out.parent), _leftovers(out.parent)


def test_sigint_during_partition_leaves_no_plan(tmp_path: Path) -> None:
    from planner.partition.synthetic import imbalanced
    from planner.profiling.profile import write_profile

    prof = tmp_path / "big.csv"
    write_profile(imbalanced(2000, seed=1, sizes=(1, 2)), prof)
    out = tmp_path / "out" / "plan.json"
    proc = _Proc(["partition", str(prof), "--devices", "8", "--global-batch", "64", "--out", str(out)], tmp_path)
    assert proc.wait_for_cpu(1.5, timeout=120), f"partition ended before it could be interrupted:\n{proc.stderr}"
    proc.p.send_signal(signal.SIGINT)
    _assert_interrupted(proc, proc.finish(), [out])


def test_sigint_during_simulate_leaves_no_output(tmp_path: Path) -> None:
    from planner.partition.synthetic import uniform_layers
    from planner.profiling.profile import write_profile

    S, M = 64, 1170  # ~150k actions with a timeline (the bound with --out): seconds of work
    write_profile(uniform_layers(S), tmp_path / "prof.csv")
    plan = {"schedule": "gpipe", "micro_batch_size": 1, "n_microbatches": M, "devices": S,
            "stages": [{"device": i, "layers": [i, i + 1]} for i in range(S)], "profile": {"path": "prof.csv"}}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "out").mkdir()
    out, timeline = tmp_path / "out" / "sim.json", tmp_path / "out" / "tl.csv"
    proc = _Proc(["simulate", str(tmp_path / "plan.json"), "--out", str(out), "--timeline", str(timeline)], tmp_path)
    assert proc.wait_for_cpu(1.2, timeout=120), f"simulate ended before it could be interrupted:\n{proc.stderr}"
    proc.p.send_signal(signal.SIGINT)
    _assert_interrupted(proc, proc.finish(), [out, timeline])


# A command whose Ctrl-C reaches it inside C code that reports it as an error of its own, as
# numpy's comparison of structured arrays (np.unique, in the simulator's memory states) turns the
# KeyboardInterrupt into a TypeError: seen once in four runs of the suite by the simulate test above.
_CONVERTED = """
import os, signal, sys
import typer
import cli.app

app = typer.Typer()

@app.command()
def convert() -> None:
    try:
        os.kill(os.getpid(), signal.SIGINT)  # Python's handler raises it at the next bytecode, here
    except KeyboardInterrupt:
        raise TypeError("Cannot compare structured arrays unless they have a common dtype") from None

@app.command()
def fail() -> None:
    raise TypeError("a bug, not an interruption")

cli.app.app = app
sys.argv = ["pplan", sys.argv[1]]
cli.app.main()
"""


@pytest.mark.parametrize("command,code", [("convert", 130), ("fail", 1)])
def test_an_interrupt_turned_into_another_error_is_still_an_interruption(command: str, code: int) -> None:
    got = subprocess.run([sys.executable, "-c", _CONVERTED, command], env=cli_env(), capture_output=True, text=True,
                         timeout=120)
    assert got.returncode == code, got.stderr
    if code == 130:
        assert got.stderr == "pplan: interrupted\n", got.stderr
    else:  # without a Ctrl-C a bug still shows its traceback
        assert "Traceback" in got.stderr and "a bug, not an interruption" in got.stderr


def test_sigint_during_profile_leaves_no_profile(tmp_path: Path) -> None:
    out = tmp_path / "out" / "p.csv"
    proc = _Proc(["profile", "--model", "synthetic:layers=6,fwd_ms=60,bwd_ms=60", "-b", "1,2,4", "--repeats", "3",
                  "--out", str(out)], tmp_path)
    # the first progress line comes after the first measurement: the command is mid-run
    assert proc.wait_for_line("profiling", timeout=120), f"no progress line:\n{proc.stderr}"
    proc.p.send_signal(signal.SIGINT)
    _assert_interrupted(proc, proc.finish(), [out])


# ---- pplan run: waiting for the processes a launcher started to go ----------------------------

def _wait_gone(launcher: int, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    left = launcher_processes(launcher)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = launcher_processes(launcher)
    return left


def _run_plan(tmp_path: Path) -> Path:
    plan = {"model": "synthetic:layers=2,fwd_ms=100,bwd_ms=100,param_bytes=1000,act_bytes=1000,hidden=8",
            "n_layers": 2, "schedule": "gpipe", "micro_batch_size": 1, "n_microbatches": 2, "devices": 2,
            "stages": [{"device": 0, "layers": [0, 1]}, {"device": 1, "layers": [1, 2]}]}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def _kill_leftovers(pids: list[int]) -> None:
    for pid in pids:  # only the ranks this test started, by id
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# ---- --debug ------------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["flag", "env"])
def test_debug_shows_the_traceback_that_ordinary_runs_hide(tmp_path: Path, how: str) -> None:
    args = ["partition", str(BAD / "profile_nan.csv"), "--devices", "2", "--global-batch", "4",
            "--out", str(tmp_path / "plan.json")]
    plain = run_pplan(*args, cwd=tmp_path)
    assert plain.returncode == 2 and "Traceback" not in plain.stderr
    assert plain.stderr.strip().startswith("pplan: error:") and len(plain.stderr.strip().splitlines()) == 1
    debug = run_pplan("--debug", *args, cwd=tmp_path) if how == "flag" else run_pplan(*args, cwd=tmp_path, PPLAN_DEBUG="1")
    assert debug.returncode != 0
    assert "Traceback (most recent call last)" in debug.stderr, debug.stderr
    assert "ProfileError" in debug.stderr and "not a finite number" in debug.stderr
    assert "load_profile" in debug.stderr  # the frames ordinary runs hide
    assert not (tmp_path / "plan.json").exists()


def test_debug_flag_works_for_every_command_that_fails(tmp_path: Path) -> None:
    plan = str(BAD / "plan_stages_overlap.json")
    for args in (["simulate", plan], ["run", plan], ["report", "--plan", plan, "--out", str(tmp_path / "r")]):
        got = run_pplan("--debug", *args, cwd=tmp_path)
        assert got.returncode != 0 and "Traceback" in got.stderr and "PlanError" in got.stderr, (args, got.stderr)


# ---- pplan run stopped: no process, run folder or output outlives it; a stopped rank is named ----

def _run_folders(tmp: Path) -> list[str]:
    return sorted(d.name for d in tmp.iterdir() if d.name.startswith("pplan-run-"))


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL],
                         ids=["sigint", "sigterm", "sighup", "sigkill"])
def test_stopping_pplan_run_leaves_no_process_no_run_folder_and_no_output(tmp_path: Path, sig: signal.Signals) -> None:
    """One run stopped by `sig` while its ranks train: no rank outlives the launcher, the temporary
    run folder is gone, no half-written run JSON is left, and the exit says what stopped it."""
    plan = _run_plan(tmp_path)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "out" / "run.json"
    p = start_pplan("run", plan, "--steps", "500", "--warmup", "1", "--device", "cpu", "--out", str(out), cwd=tmp_path,
                    env=cli_env(TMPDIR=str(tmp)), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                    start_new_session=True)
    proc = _Proc.__new__(_Proc)  # reuse the line collector around this Popen (TMPDIR differs)
    proc.p, proc.lines = p, []
    proc._t = threading.Thread(target=proc._pump, daemon=True)
    proc._t.start()
    launcher = p.pid
    try:
        assert proc.wait_for_line("step 1/", timeout=180), f"the ranks never reported a step:\n{proc.stderr}"
        ranks = launcher_processes(launcher)
        assert len(ranks) >= 2, f"expected the 2 rank processes, found {ranks}"
        assert _run_folders(tmp), "no run folder while running"
        p.send_signal(sig)
        code = proc.finish(timeout=60)
        left = _wait_gone(launcher, timeout=20)
        deadline = time.monotonic() + 10  # after SIGKILL the ranks remove it when they notice (0.5 s polls)
        while _run_folders(tmp) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        _kill_leftovers(launcher_processes(launcher))
    assert not left, f"rank processes {left} outlived `pplan run` stopped by {sig.name}"
    assert _run_folders(tmp) == [], f"left behind in TMPDIR after {sig.name}"
    assert not out.exists()
    if sig == signal.SIGINT:
        assert code == 130, f"exit code {code}; stderr:\n{proc.stderr}"
    elif sig != signal.SIGKILL:
        assert code == -sig, f"exit {code}: pplan run should end by the signal it got"
    if sig != signal.SIGKILL:
        assert "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.slow
def test_a_run_started_under_nohup_outlives_a_hangup(tmp_path: Path) -> None:
    """SIGHUP ignored when the run starts (nohup) stays ignored: the run went on ending with the terminal."""
    plan = _run_plan(tmp_path)
    p = start_pplan("run", plan, "--steps", "500", "--warmup", "1", "--device", "cpu", cwd=tmp_path,
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
                    preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    proc = _Proc.__new__(_Proc)
    proc.p, proc.lines = p, []
    proc._t = threading.Thread(target=proc._pump, daemon=True)
    proc._t.start()
    try:
        assert proc.wait_for_line("step 1/", timeout=180), f"the ranks never reported a step:\n{proc.stderr}"
        p.send_signal(signal.SIGHUP)
        assert proc.wait_for_line("step 3/", timeout=180), f"the hang-up ended the run:\n{proc.stderr}"
        assert p.poll() is None
        p.send_signal(signal.SIGTERM)
        assert proc.finish(timeout=60) == -signal.SIGTERM
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        _kill_leftovers(launcher_processes(p.pid))


@pytest.mark.slow
def test_a_stopped_rank_is_named_not_the_peers_that_waited_for_it(tmp_path: Path) -> None:
    plan = _run_plan(tmp_path)
    proc = _Proc(["run", str(plan), "--steps", "500", "--warmup", "1", "--device", "cpu", "--timeout", "5"], tmp_path)
    launcher = proc.p.pid
    victim = None
    try:
        assert proc.wait_for_line("step 1/", timeout=180), f"the ranks never reported a step:\n{proc.stderr}"
        ranks = rank_pids(launcher)
        assert sorted(ranks) == [0, 1], ranks
        victim = ranks[1]
        os.kill(victim, signal.SIGSTOP)  # alive, silent: its peer times out waiting for it
        code = proc.finish(timeout=90)
    finally:
        if victim is not None:
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _kill_leftovers(launcher_processes(launcher))
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("pplan: error:")]
    assert code == 1 and len(errors) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert errors[0].startswith("pplan: error: rank 1 stopped answering"), errors[0]
