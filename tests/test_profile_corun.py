"""`pplan profile --co-run K`: the metadata key, the refusals, and no background process left
behind, whether profiling ends well, with an error, with Ctrl-C or with the parent killed;
each holds with workers forked warm and with PPLAN_WARM_START=0 (fresh; run the file both ways).
No test here asserts a time: what co-running measures is checked side by side by hand
(docs/simulator.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from planner.errors import PplanError, ProfileError
from planner.hostinfo import usable_cores
from planner.profiling import profiler
from planner.profiling.corun import CoRun, check_co_run
from planner.profiling.metadata import MAX_CO_RUN
from planner.profiling.profile import load_profile, make_profile, read_profile_text, write_profile
from planner.warm_start import warm_start_enabled

from helpers.cli import run_pplan
from helpers.profiles import profile_csv
from helpers.ranks import alive

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="process states are read from /proc")
TWO_CORES = pytest.mark.skipif(usable_cores() < 2, reason="a co-run of 1 with 1 thread needs 2 cores")
SMALL = "mlp:layers=2,hidden=16"
GOOD = profile_csv({"input_bytes_per_sample": 16}, ["0,a,1,1.0,2.0,100,10,4", "1,b,1,1.5,3.0,50,12,4"])


def _gone_within(pids: list[int], limit_s: float = 60.0) -> bool:
    """True once none of `pids` runs (an orphaned worker notices its parent's death by itself;
    a zombie counts as gone, its reaper may be slow to collect it)."""
    deadline = time.monotonic() + limit_s
    while any(alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


class _Recording(CoRun):
    """CoRun that remembers its workers' pids for the test to check afterwards."""

    started: list[int] = []

    def start(self) -> "CoRun":
        super().start()
        _Recording.started.extend(self.pids)
        return self


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    _Recording.started = []
    monkeypatch.setattr(profiler, "CoRun", _Recording)
    return _Recording.started


def test_co_run_metadata_round_trips_and_old_profiles_load(tmp_path: Path) -> None:
    p = read_profile_text(GOOD)
    assert "co_run" not in p.meta  # a profile from before --co-run: measured alone
    q = make_profile(list(p.names), list(p.micro_batch_sizes), dict(p.columns), {"co_run": "3"})
    write_profile(q, tmp_path / "q.csv")
    assert load_profile(tmp_path / "q.csv").meta["co_run"] == "3"


@pytest.mark.parametrize("value, words", [("-1", "out of range"), ("two", "not an integer"),
                                          (str(MAX_CO_RUN + 1), "out of range")])
def test_bad_co_run_metadata_is_refused(value: str, words: str) -> None:
    with pytest.raises(ProfileError, match=words):
        read_profile_text(GOOD.replace("# input_bytes", f"# co_run: {value}\n# input_bytes"))


@pytest.mark.parametrize("k, threads, cores, device, words", [
    (-1, 1, 2, "cpu", ">= 0"), (MAX_CO_RUN + 1, 1, 10**6, "cpu", f"more than {MAX_CO_RUN}"),
    (1, 1, 2, "cuda", "each GPU has its own memory"), (3, 1, 2, "cpu", "needs 4 cores"),
    (1, 2, 2, "cpu", "needs 4 cores"),
])
def test_co_run_is_refused_with_values(k: int, threads: int, cores: int, device: str, words: str) -> None:
    with pytest.raises(PplanError, match=words):
        check_co_run(k, threads, cores, device)


def test_co_run_within_bounds_is_accepted() -> None:
    check_co_run(0, 8, 1, "cuda")  # 0: measured alone, anywhere
    check_co_run(3, 2, 8, "cpu")


def test_profile_model_refuses_before_starting_anything(recorded: list[int]) -> None:
    with pytest.raises(PplanError, match=">= 0"):
        profiler.profile_model(SMALL, [2], co_run=-1)
    with pytest.raises(PplanError, match="more than"):
        profiler.profile_model(SMALL, [2], co_run=MAX_CO_RUN + 1)
    assert recorded == []


def test_cli_refuses_co_run_before_importing_torch(tmp_path: Path) -> None:
    got = run_pplan("profile", "-m", SMALL, "--co-run", "-2", "-o", str(tmp_path / "p.csv"), cwd=tmp_path)
    assert got.returncode == 2 and "co-run -2" in got.stderr and "Traceback" not in got.stderr
    got = run_pplan("profile", "-m", "gpt", "--analytic", "--hardware", "a100-80gb", "--co-run", "1",
                    "-o", str(tmp_path / "p.csv"), cwd=tmp_path)
    assert got.returncode == 2 and "co-run 1 with --analytic" in got.stderr and "not measured" in got.stderr
    assert not (tmp_path / "p.csv").exists()


@pytest.mark.slow
@TWO_CORES
def test_small_model_profiles_with_co_run_and_leaves_no_process(recorded: list[int], tmp_path: Path) -> None:
    prof = profiler.profile_model(SMALL, [2, 4], warmup=1, repeats=2, co_run=1)
    assert prof.meta["co_run"] == "1" and len(recorded) == 1
    assert (prof.columns["fwd_ms"] > 0).all() and (prof.columns["optimizer_ms"] > 0).all()
    assert not any(alive(p) for p in recorded)  # reaped before profile_model returned
    write_profile(prof, tmp_path / "p.csv")
    assert load_profile(tmp_path / "p.csv").meta["co_run"] == "1"
    assert profiler.profile_model(SMALL, [2], warmup=0, repeats=1).meta["co_run"] == "0"


@pytest.mark.slow
@TWO_CORES
@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_no_process_is_left_after_an_error_or_ctrl_c(recorded: list[int], exc: type[BaseException]) -> None:
    def fail(done: int, total: int, note: str) -> None:
        raise exc("stopped by the test")  # after the first layer, with the workers training

    with pytest.raises(exc, match="stopped by the test"):
        profiler.profile_model(SMALL, [2], warmup=0, repeats=1, co_run=1, on_step=fail)
    assert len(recorded) == 1 and not any(alive(p) for p in recorded)


@pytest.mark.slow
def test_a_worker_that_cannot_build_the_model_is_one_line_and_gone() -> None:
    bg = CoRun(1, "mlp:layers=2,nonsense=3", threads=1)
    with pytest.raises(PplanError, match=r"co-run worker 0 .*nonsense") as info:
        with bg:
            pids = bg.pids
            bg.set_batch(2)
    assert "\n" not in info.value.one_line() and not any(alive(p) for p in pids)


@pytest.mark.slow
@TWO_CORES
def test_a_worker_that_dies_while_measuring_is_reported() -> None:
    with CoRun(1, SMALL, threads=1) as bg:
        bg.set_batch(2)
        bg.set_batch(2)  # a repeated size is answered too
        os.kill(bg.pids[0], signal.SIGKILL)
        with pytest.raises(PplanError, match="exited .* while the layers were being measured"):
            for _ in range(600):  # until the kernel has delivered the kill
                bg.check()
                time.sleep(0.05)


@pytest.mark.slow
@TWO_CORES
def test_workers_stop_when_the_profiler_is_killed(tmp_path: Path) -> None:
    """A parent killed outright (no finally runs) closes the workers' stdin: they exit themselves."""
    script = ("import os, sys\nfrom planner.profiling.corun import CoRun\n"
              f"bg = CoRun(1, {SMALL!r}, threads=1).start()\nbg.set_batch(2)\n"
              "print(*bg.pids, flush=True)\nos.kill(os.getpid(), 9)\n")
    got = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    pids = [int(p) for p in got.stdout.split()]
    assert got.returncode == -9 and len(pids) == 1, got.stderr
    assert _gone_within(pids)


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


@pytest.mark.slow
def test_a_warm_worker_is_named_and_goes_when_the_co_run_closes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forked from the warm server, not this process: found by the pid CoRun reports and its name."""
    monkeypatch.setenv("PPLAN_WARM_START", "1")
    if not warm_start_enabled():
        pytest.skip("warm start needs Linux")
    with CoRun(1, SMALL, threads=1) as bg:
        pid = bg.pids[0]
        deadline = time.monotonic() + 120
        while _name(pid) != "pplan-corun0" and time.monotonic() < deadline:  # named just after the fork
            time.sleep(0.05)
        assert _name(pid) == "pplan-corun0" and os.getsid(pid) == pid
    assert not alive(pid)  # stopped (its stdin closed first) and reaped by close()
