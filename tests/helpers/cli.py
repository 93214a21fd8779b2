"""Running the real `pplan` CLI: in this process (the conftest `pplan` fixture, or `run_captured`
for many cases in one module fixture), or as a real process where a test needs one (signals,
exit without a traceback, start-up imports, torchrun)."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import threading
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"

JOB_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PPLAN_DEBUG")
"""Variables a developer's shell or a torchrun job may set that change what a command does."""


def one_error_line(code: int, err: str) -> str:
    """The one `pplan: error:` line of a refusal (exit 2, no traceback, nothing else on stderr)."""
    assert code == 2, err
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("pplan: error:"), err
    return lines[0]


def run_in_process(monkeypatch: Any, capsys: Any, *args: object) -> tuple[int, str, str]:
    """Run `cli.app.main` with `args` in this process: (exit code, stdout, stderr)."""
    from cli.app import main
    from cli.common import state

    monkeypatch.setattr(sys, "argv", ["pplan", *map(str, args)])
    monkeypatch.setattr(state, "debug", False)  # `--debug` sets a global: one run must not leak into the next
    code = 0
    try:
        main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    out = capsys.readouterr()
    return code, out.out, out.err


@dataclass(frozen=True)
class Captured:
    """What one in-process `pplan` command left behind."""

    code: int
    """Its exit code: SystemExit's, 1 for an exception that escaped main() (as Python exits)."""
    out: str
    """Its stdout."""
    err: str
    """Its stderr, then any escaped exception's traceback and every Python warning it raised."""


class Hang(BaseException):
    """The command ran past its deadline (a BaseException: no `except Exception` swallows it)."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise Hang in this (main) thread after `seconds`; elsewhere no deadline can be set."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _expired(signum: int, frame: Any) -> None:
        raise Hang(f"still running after {seconds:g} s (a hang)")

    previous = signal.signal(signal.SIGALRM, _expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_captured(*args: object, cwd: Path, timeout_s: float = 30.0) -> Captured:
    """Run `cli.app.main` with `args` in this process, from `cwd`, as `python -m cli.app ARGS
    -W always` would, without fixtures (so a module fixture can run many cases at ~ms each where
    a subprocess costs ~0.35 s of CPU): a traceback or a warning lands in `err` as it would on a
    real stderr. Restores argv, the working directory and the --debug flag afterwards."""
    from cli.app import main
    from cli.common import state

    saved = (sys.argv, os.getcwd(), state.debug)
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with warnings.catch_warnings(record=True) as raised:
        warnings.simplefilter("always")  # every warning, even one this process already showed
        try:
            sys.argv, state.debug = ["pplan", *map(str, args)], False
            os.chdir(cwd)
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), deadline(timeout_s):
                main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except (Exception, Hang):  # noqa: BLE001 - shown as Python shows an uncaught one
            code = 1
            err.write(traceback.format_exc())
        finally:
            sys.argv, state.debug = saved[0], saved[2]
            os.chdir(saved[1])
    for w in raised:
        err.write(warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line))
    return Captured(code, out.getvalue(), err.getvalue())


def run_in_repo(*args: object, timeout_s: float = 300.0) -> subprocess.CompletedProcess:
    """`pplan ARGS` through run_captured from the repository, as run_pplan runs it in a process
    (warnings and an escaped traceback in stderr, a hang guard), returned as a CompletedProcess."""
    got = run_captured(*args, cwd=REPO, timeout_s=timeout_s)
    return subprocess.CompletedProcess(["pplan", *map(str, args)], got.code, got.out, got.err)


def cli_env(**extra: str) -> dict[str, str]:
    """The environment for a `pplan` subprocess: this one without job variables, with the
    repository (and tests/, for test models such as `dropout_model:build`) importable."""
    env = {k: v for k, v in os.environ.items() if k not in JOB_VARS}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])])
    env.update(extra)
    return env


def pplan_command(*args: object) -> list[str]:
    return [sys.executable, "-m", "cli.app", *map(str, args)]


def run_pplan(*args: object, cwd: Path | None = None, timeout: float = 300, env: dict[str, str] | None = None,
              **extra_env: str) -> subprocess.CompletedProcess:
    """Run `python -m cli.app ARGS` in a subprocess, as a user would, capturing text output.
    `env` replaces the environment entirely; `extra_env` adds to `cli_env()`."""
    return subprocess.run(pplan_command(*args), cwd=cwd or REPO, env=env if env is not None else cli_env(**extra_env),
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def start_pplan(*args: object, cwd: Path | None = None, **popen: Any) -> subprocess.Popen:
    """Start `python -m cli.app ARGS` without waiting (for tests that signal or watch it);
    `popen` goes to subprocess.Popen (env defaults to `cli_env()`)."""
    popen.setdefault("env", cli_env())
    popen.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.Popen(pplan_command(*args), cwd=cwd or REPO, **popen)
