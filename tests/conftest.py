"""Shared fixtures: one in-process runner of the real `pplan` entry point, small seeded inputs in
temporary folders, and an environment that does not depend on the developer's machine.

Helpers that are not fixtures live in tests/helpers/ (CLI subprocess runners, synthetic profiles
and plans, figure decoding); tests import those, never another test module.
"""

from __future__ import annotations

import compileall
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterator

import pytest
from hypothesis import settings

from helpers.cli import JOB_VARS, cli_env, run_in_process, run_in_repo

# Property tests draw the same examples on every machine and every run, so the suite's verdict
# never depends on luck; PPLAN_HYPOTHESIS=explore draws new ones (to hunt for bugs, not in CI).
settings.register_profile("pplan", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile("explore" if os.environ.get("PPLAN_HYPOTHESIS") == "explore" else "pplan")

DATA = Path(__file__).resolve().parent / "data"


def pytest_configure(config: pytest.Config) -> None:
    """Compile the project's modules once, before any test starts a process, where Python is told
    not to write bytecode (PYTHONDONTWRITEBYTECODE, as on this project's machines): then no process reuses
    it and each of the ~250 commands and ranks the suite starts would compile the modules it imports
    again (a rank's: 0.93-1.01 s of CPU to import its module, 0.52-0.61 s compiled, here). Reading
    bytecode stays on under that setting. Up to date files are skipped, and a folder that cannot be
    written is left as it is."""
    if not sys.dont_write_bytecode or hasattr(config, "workerinput"):
        return  # (an xdist worker: the controller compiled them before starting it)
    root = Path(__file__).resolve().parent.parent
    for folder in ("planner", "cli", "tests"):
        compileall.compile_dir(root / folder, quiet=2)


MAX_WORKERS = 4


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (pyproject.toml): one worker per core this process may run on (its affinity, not
    the host's count, which a container may not grant), at most MAX_WORKERS. More would not help:
    the multi-process tests already start up to 8 processes each, and every worker holds torch."""
    return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                      else os.cpu_count() or 1))


@pytest.fixture(scope="session", autouse=True)
def machine_independent_env() -> Iterator[None]:
    """No test depends on this machine's state: no calibration file from `pplan calibrate
    --machine` (~/.cache/pplan/machine.json) is applied, and no PPLAN_DEBUG or torchrun variable
    from the developer's shell changes what a command does. Session-wide, so module-scoped
    fixtures and subprocesses (they inherit os.environ) see it too; a test may still set them."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PPLAN_MACHINE", "off")
        for name in JOB_VARS:
            mp.delenv(name, raising=False)
        yield


@pytest.fixture(scope="session", autouse=True)
def interruptible_children() -> Iterator[None]:
    """Commands this suite starts can be stopped with SIGINT even when pytest itself was started
    with SIGINT ignored (a shell's background job, `cmd &`, ignores it, and an ignored signal stays
    ignored across exec, so the ctrl-C tests would see commands finish instead). A handler, unlike
    SIG_IGN, is reset to the default on exec, which Python turns into KeyboardInterrupt."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.fixture
def pplan(monkeypatch, capsys) -> Callable[..., tuple[int, str, str]]:
    """pplan(*args) -> (exit code, stdout, stderr), running cli.app.main in this process."""

    def run(*args: object) -> tuple[int, str, str]:
        return run_in_process(monkeypatch, capsys, *args)

    return run


@pytest.fixture
def analytic_profile(pplan, tmp_path: Path) -> Callable[[str, str], Path]:
    """analytic_profile(gpt spec, "1,2") -> tmp_path/gpt.csv: `pplan profile --analytic` of the
    model on a100-80gb in bfloat16 at those micro-batch sizes."""

    def make(model: str, sizes: str) -> Path:
        path = tmp_path / "gpt.csv"
        code, _, err = pplan("profile", "--analytic", "--model", model, "--hardware", "a100-80gb", "--dtype",
                             "bfloat16", "-b", sizes, "-o", path)
        assert code == 0, err
        return path

    return make


@pytest.fixture
def run_cli(monkeypatch) -> Callable[..., subprocess.CompletedProcess]:
    """run_cli(*args) -> CompletedProcess: helpers.cli.run_pplan's call in this process
    (helpers.cli.run_in_repo: warnings and tracebacks in stderr, a hang guard), with the
    processes the command starts (ranks) seeing tests/ on PYTHONPATH as run_pplan's do. Saves the
    ~0.35 s (1.3 s where the command imports torch) of CPU a subprocess costs; keep run_pplan
    where the process itself is tested (signals, imports)."""
    monkeypatch.setenv("PYTHONPATH", cli_env()["PYTHONPATH"])
    return run_in_repo


@pytest.fixture
def sim_work(tmp_path: Path) -> Path:
    """A temporary folder holding the sample plan (plan.json, 3 devices, 1f1b, 8 micro-batches)
    and the profile it names (sim_profile.csv), to simulate, edit or break."""
    shutil.copy(DATA / "sim_plan.json", tmp_path / "plan.json")
    shutil.copy(DATA / "sim_profile.csv", tmp_path / "sim_profile.csv")
    return tmp_path


@pytest.fixture
def tiny_gpt_csv(tmp_path: Path) -> Path:
    """tmp_path/gpt.csv: the analytic profile of a small GPT (4 blocks, hidden 256, seq 64,
    vocab 1000), deterministic; a calibration written beside it stays in tmp_path."""
    from planner.partition.synthetic import gpt_like
    from planner.profiling.profile import write_profile

    path = tmp_path / "gpt.csv"
    write_profile(gpt_like(n_blocks=4, hidden=256, seq=64, vocab=1000), path)
    return path


@pytest.fixture
def symlink_loop(tmp_path: Path) -> Path:
    """tmp_path/loopa -> loopb -> loopa: a path no read can follow (Path.resolve raises RuntimeError)."""
    a, b = tmp_path / "loopa", tmp_path / "loopb"
    os.symlink(b.name, a)
    os.symlink(a.name, b)
    return a


@pytest.fixture
def machine_bench(monkeypatch) -> list[int]:
    """`pplan calibrate --machine`'s bench replaced by one that returns a made-up entry at once
    (helpers.machines.made_up_machine); the list of the rank counts it was asked to measure."""
    from planner.execute import machinebench
    from helpers.machines import made_up_machine

    asked: list[int] = []

    def fake(*, ranks, **kw):
        asked.append(ranks)
        return made_up_machine(ranks)

    monkeypatch.setattr(machinebench, "measure_machine", fake)
    return asked
