"""Functions test_warm_start.py runs in a started process (warm or fresh); each reports what the
process sees on stdout, as JSON, or behaves in one way a process can end."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path


def describe(*args: str) -> int:
    """Print what this process was given; exit with the number of arguments."""
    json.dump({"args": list(args), "argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ),
               "sid_is_pid": os.getsid(0) == os.getpid(), "name": Path("/proc/self/comm").read_text().strip(),
               "path_head": sys.path[:3], "ppid": os.getppid()}, sys.stdout)
    print(file=sys.stderr, end="to stderr\n")
    return len(args)


def echo_stdin() -> None:
    """Copy stdin to stdout, upper-cased, line by line, until stdin closes."""
    for line in sys.stdin:
        sys.stdout.write(line.upper())
        sys.stdout.flush()


def exit_with(how: str) -> None:
    """End by SystemExit(int), SystemExit(text), an exception, or a signal, as `how` says."""
    if how == "code":
        sys.exit(7)
    if how == "text":
        sys.exit("stopped: no input")
    if how == "raise":
        raise ValueError("a rank's own error")
    if how == "signal":
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(10)


def sleep_forever() -> None:
    print("sleeping", flush=True)
    time.sleep(600)
