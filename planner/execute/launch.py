"""Local launch: one process per rank on this machine, watched until all finish or one fails.

Each rank runs planner.execute.worker on CONFIG with torchrun's environment variables
(MASTER_ADDR=127.0.0.1, a free port), forked from the process that imported torch once
(planner/warm_start.py) or a fresh interpreter, in its own session so a terminal's Ctrl-C reaches only
the launcher. The launcher forwards the ranks' progress lines, keeps the last lines of each for
error messages, and polls: the first rank to exit non-zero ends the run — the others are
terminated (then killed) at once and RunError names the rank and its cause. Ranks also watch
the launcher and exit if it disappears, so no process outlives `pplan run`.

A rank that hangs makes its peers fail after the process-group timeout, and the first failure
would then blame a healthy peer ("rank 0 failed: ... timed out"). So the launcher also reads
each live rank's state in /proc: a rank whose process is stopped (state T or t: SIGSTOP, a
debugger) is named as the one that stopped answering, ahead of the peers that gave up waiting
for it; and a rank stopped for longer than the timeout ends the run even when no peer notices
(e.g. a single rank).
"""

from __future__ import annotations

import collections
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from planner.errors import PplanError, RunError
from planner.execute.measurement import RankMeasurement, measurements_from_json
from planner.hostinfo import process_stat
from planner.warm_start import PARENT_ENV, start_rank_process

__all__ = ["free_port", "launch_local", "stop_processes"]

_POLL_S = 0.1
_GRACE_S = 0.4  # after a first failure, how long to wait for simultaneous ones (to pick the cause)
_TERM_S = 3.0
_COMM_WORDS = ("connection", "gloo", "nccl", "timed out", "timeout", "peer", "socket", "broken pipe", "closed")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pump(stream: IO[bytes], rank: int, tail: collections.deque, verbose: bool, n_ranks: int) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace").rstrip("\n")
        tail.append(line)
        if line.startswith("[pplan] "):
            sys.stderr.write(f"  {line[8:]}\n" if n_ranks == 1 or not verbose else f"  [rank {rank}] {line[8:]}\n")
            sys.stderr.flush()
        elif verbose:
            sys.stderr.write(f"  [rank {rank}] {line}\n")
            sys.stderr.flush()
    stream.close()


def _cause(rank: int, code: int, run_dir: Path, tail: collections.deque) -> tuple[str, bool, int]:
    """(one-line cause, looks like a consequence of another rank's failure, exit code to use)."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"rank {rank} was killed by {name}", False, 1
    err = run_dir / f"rank{rank}.error.json"
    if err.is_file():
        try:
            info = json.loads(err.read_text(encoding="utf-8"))
            msg = str(info.get("message", ""))
            comm = any(w in msg.lower() for w in _COMM_WORDS)
            return f"rank {rank} failed: {msg}", comm, int(info.get("exit_code", 1))
        except (OSError, ValueError):
            pass
    last = next((ln for ln in reversed(tail) if ln.strip()), "no output")
    return f"rank {rank} exited with code {code}: {' '.join(last.split())[:300]}", False, 1


def _stopped(procs: list[subprocess.Popen]) -> list[int]:
    """Ranks whose process is alive but stopped (SIGSTOP, SIGTSTP, a debugger)."""
    return [r for r, p in enumerate(procs) if p.poll() is None and process_stat(p.pid)[:1] in (["T"], ["t"])]


def stop_processes(procs: list[subprocess.Popen]) -> None:
    """Terminate every live process (a stopped one is continued so it can act on it), then kill
    what is left after a grace period (the ranks of a run, or of a benchmark)."""
    for p in procs:
        if p.poll() is None:
            try:
                p.terminate()
                os.kill(p.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + _TERM_S
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def launch_local(cfg: dict[str, Any], n_ranks: int, run_dir: Path, threads: int,
                 verbose: bool = False) -> list[RankMeasurement]:
    """Run `n_ranks` worker processes; returns the ranks' measurements (from rank 0's result.json)."""
    cfg = dict(cfg, run_dir=str(run_dir))
    cfg_path = run_dir / "config.json"
    cfg_path.write_text(json.dumps(cfg), encoding="utf-8")
    procs: list[subprocess.Popen] = []
    tails = [collections.deque(maxlen=60) for _ in range(n_ranks)]
    pumps: list[threading.Thread] = []
    timeout_s = float((cfg.get("options") or {}).get("timeout_s") or 300.0)
    stopped_since: dict[int, float] = {}
    try:
        _start_workers(cfg_path, n_ranks, threads, verbose, procs, tails, pumps)
        while True:
            codes = [p.poll() for p in procs]
            if all(c == 0 for c in codes):
                break
            now = time.monotonic()
            halted = _stopped(procs)
            stopped_since = {r: stopped_since.get(r, now) for r in halted}
            overdue = [r for r, t in stopped_since.items() if now - t > timeout_s]
            if overdue and all(c in (None, 0) for c in codes):
                stop_processes(procs)
                raise RunError(f"rank {overdue[0]} stopped answering: its process has been stopped (SIGSTOP or a debugger) "
                               f"for more than --timeout {timeout_s:g} s",
                               "the other ranks were stopped; continue a stopped rank (SIGCONT) or leave it alone, then rerun")
            if any(c not in (None, 0) for c in codes):
                _raise_failure(procs, pumps, halted, run_dir, tails)
            time.sleep(_POLL_S)
        for t in pumps:
            t.join(timeout=5.0)
    finally:
        stop_processes(procs)
    result = run_dir / "result.json"
    if not result.is_file():
        raise RunError("all ranks exited cleanly but rank 0 wrote no result", "rerun with --verbose")
    return measurements_from_json(json.loads(result.read_text(encoding="utf-8")), "rank 0's result.json")


def _start_workers(cfg_path: Path, n_ranks: int, threads: int, verbose: bool, procs: list[subprocess.Popen],
                   tails: list[collections.deque], pumps: list[threading.Thread]) -> None:
    """Start one worker per rank on a fresh loopback rendezvous, each in its own session (so a
    stop reaches its children), with a thread pumping its output; appends to procs and pumps as
    it goes, so the caller's cleanup stops whatever started before a failure."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "GROUP_", "ROLE_"))}
    base.update({
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(n_ranks),
        "LOCAL_WORLD_SIZE": str(n_ranks), PARENT_ENV: str(os.getpid()),
        "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1",
    })
    for r in range(n_ranks):
        env = dict(base, RANK=str(r), LOCAL_RANK=str(r))
        p = start_rank_process("planner.execute.worker:rank_entry", [str(cfg_path)], env, name=f"pplan-rank{r}",
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        procs.append(p)
        t = threading.Thread(target=_pump, args=(p.stdout, r, tails[r], verbose, n_ranks), daemon=True)
        t.start()
        pumps.append(t)


def _raise_failure(procs: list[subprocess.Popen], pumps: list[threading.Thread], halted: list[int], run_dir: Path,
                   tails: list[collections.deque]) -> None:
    """A rank exited with an error: stop the others and raise the cause, real causes before the
    "connection closed" echoes of their peers, and a stopped rank named as the cause."""
    time.sleep(_GRACE_S)
    codes = [p.poll() for p in procs]
    halted = sorted(set(halted) | set(_stopped(procs)))
    stop_processes(procs)
    for t in pumps:
        t.join(timeout=1.0)
    failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
    causes = [_cause(r, c, run_dir, tails[r]) for r, c in failed]
    causes.sort(key=lambda x: x[1])
    text = causes[0][0]
    if len(causes) > 1:
        text += f" (then {', '.join(c[0].split(':')[0] for c in causes[1:])})"
    if halted and causes[0][2] != 2:
        # the stopped rank is the cause; the failed ones gave up waiting for it
        names = ", ".join(f"rank {r}" for r in halted)
        raise RunError(f"{names} stopped answering: its process was stopped (SIGSTOP or a debugger) while "
                       f"its peers waited; then {text}",
                       "continue a stopped rank (SIGCONT) or leave it alone, then rerun; --timeout sets how "
                       "long peers wait")
    if causes[0][2] == 2:
        raise PplanError(text)
    hint = "the other ranks were stopped; rerun with --verbose for their output"
    if causes[0][1]:
        hint = ("a rank waited for a peer in vain (peer hung, dead or slower than --timeout); " + hint)
    raise RunError(text, hint)
