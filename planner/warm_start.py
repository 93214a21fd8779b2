"""Warm start: processes forked from one server that has already imported torch.

Every rank of a local run (`pplan run`) and every co-run worker (`pplan profile --co-run K`)
used to be a fresh interpreter that imported torch and its pipelining package before doing
anything: 3-6 s of CPU each on a 2-core machine, paid again by every process of every run, and
paid concurrently, so an 8-rank run spent most of its start-up importing. Instead the launcher
(the `pplan run` or `pplan profile` process) keeps one server process (started on first use,
kept for the launcher's life) that imports those modules once and then forks a child per
request. A child is like a fresh process: its own session, the environment, working directory,
stdin/stdout/stderr and arguments the launcher asked for, and its exit status reported back;
`WarmProcess` answers the part of `subprocess.Popen` the launchers use (pid, poll, wait,
terminate, kill, pipes). Layer 0: generic process starting, importing nothing of pplan above it
(the modules it preloads are named as strings, imported by the server alone).

Why fork is safe here: the server only imports (torch starts no threads on import; numpy's
BLAS pool handles fork itself) and never touches CUDA, so a child initializes CUDA, OpenMP and
its process group itself, as a fresh process would.

The server's parent is the launcher; a child's parent is the server, which exits as soon as
the launcher's end of its socket closes (the launcher exited or was killed). A rank watches the
launcher itself (execute/worker.py), not its parent; a co-run worker stops when its stdin, held
by the launcher alone, closes. A child's /proc/PID/environ is the server's, not
the environment it was given (which is its os.environ), so the server is started with
PPLAN_PARENT_PID naming the launcher, and children are named (`pplan-rank3`, `pplan-corun0` in
ps) for people.

`PPLAN_WARM_START=0` turns this off (every process a fresh `python -c`), as does a platform
without fork; both paths give the same processes.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import IO, Any, Sequence

from planner.errors import RunError

__all__ = ["PARENT_ENV", "RequestTooLarge", "WarmProcess", "WarmStarter", "prestart", "set_process_name",
           "start_rank_process", "warm_start_enabled"]

ENV_SWITCH = "PPLAN_WARM_START"
PARENT_ENV = "PPLAN_PARENT_PID"  # the launcher's pid, in the environment of what it started (module docstring)
# What the server imports (and their parents) for its children: names, not imports, since they
# lie above this layer. Ranks (execute/launch.py) run planner.execute.worker, which trains with
# torch.distributed.pipelining and planner.execute.train; co-run workers (profiling/corun.py) run
# planner.profiling.corun.
_PRELOAD = ("torch.distributed.pipelining", "planner.execute.worker", "planner.execute.train", "planner.profiling.corun")
_MAX_REQUEST = 64 << 10  # bytes of one request (target, arguments, environment); a socket datagram's size is bounded
_STATUS = struct.Struct("!i")


def warm_start_enabled() -> bool:
    """Whether processes are forked from the warm server (Linux, unless PPLAN_WARM_START=0)."""
    return sys.platform.startswith("linux") and os.environ.get(ENV_SWITCH, "1") != "0"


# ---------------------------------------------------------------- the server process

def _serve(control: socket.socket) -> None:
    """Import the children's modules, then fork a child per request until the launcher goes away."""
    for name in _PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a child importing it again reports the error as a fresh process would
            pass
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    children: dict[int, socket.socket] = {}
    while True:
        ready = select.select([control, wake_r], [], [])[0]
        if wake_r in ready:
            os.read(wake_r, 4096)
            _reap(children)
        if control in ready:
            msg, fds, _, _ = socket.recv_fds(control, _MAX_REQUEST, 4)
            if not msg:
                return  # the launcher closed its end: it has exited
            status = socket.socket(fileno=fds[0])
            pid = os.fork()
            if pid == 0:
                _child(json.loads(msg), fds[1:], [control, status, *children.values()], (wake_r, wake_w))
            for fd in fds[1:]:
                os.close(fd)
            status.send(_STATUS.pack(pid))
            children[pid] = status


def _reap(children: dict[int, socket.socket]) -> None:
    """Send each exited child's status (as subprocess reports it: -N for signal N) and forget it."""
    while True:
        try:
            pid, raw = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        status = children.pop(pid, None)
        if status is not None:
            try:
                status.send(_STATUS.pack(os.waitstatus_to_exitcode(raw)))
            except OSError:
                pass  # the launcher stopped listening to this child
            status.close()


def _child(req: dict[str, Any], stdio: list[int], inherited: list[socket.socket], wake: tuple[int, int]) -> None:
    """Become the requested process; never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for s in inherited:  # the server's sockets: held here, they would hide the server's exit
            s.close()
        for fd in wake:
            os.close(fd)
        os.setsid()
        set_process_name(req["name"])
        for target, fd in enumerate(stdio):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(req["env"])
        os.chdir(req["cwd"])
        # what a fresh `python -c` would have on sys.path: the working directory, then PYTHONPATH
        extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
        sys.path[:1] = ["", *extra]
        sys.argv = ["-c", *req["args"]]
        if os.environ.get("PYTHONUNBUFFERED"):
            for stream in (sys.stdout, sys.stderr):
                stream.reconfigure(write_through=True)  # type: ignore[union-attr]
        module, _, func = req["target"].partition(":")
        result = getattr(importlib.import_module(module), func)(*req["args"])
        code = result if isinstance(result, int) else 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            sys.stderr.write(f"{e.code}\n")
    except BaseException:  # noqa: BLE001 - as Python would: the traceback on stderr, exit 1
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed pipe: nothing left to say
                pass
        os._exit(code)


def set_process_name(name: str) -> None:
    """Show `name` (up to 15 bytes) as this process's name in ps and top, where Linux allows it."""
    if not name or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # 15: PR_SET_NAME
    except (OSError, AttributeError):
        pass


def serve_main() -> None:
    """Entry of the server process: `python -c ... serve_main()` with the control socket's fd."""
    _serve(socket.socket(fileno=int(sys.argv[1])))


# ---------------------------------------------------------------- the launcher side

class RequestTooLarge(ValueError):
    """A start request (mostly its environment) does not fit the server's message size."""


class WarmProcess:
    """A child of the warm server, answering what the launchers ask of `subprocess.Popen`."""

    def __init__(self, args: Sequence[str], pid: int, status: socket.socket, stdin: IO[Any] | None,
                 stdout: IO[Any] | None, stderr: IO[Any] | None):
        self.args, self.pid, self._status = list(args), pid, status
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.returncode: int | None = None
        self._lock = threading.Lock()

    def _collect(self, timeout: float | None) -> None:
        if self.returncode is not None or not select.select([self._status], [], [], timeout)[0]:
            return
        with self._lock:
            if self.returncode is not None:
                return  # another thread read it meanwhile
            data = self._status.recv(_STATUS.size)
            self._status.close()
            if len(data) == _STATUS.size:
                self.returncode = _STATUS.unpack(data)[0]
            else:  # the server died before this child (someone killed it): take the child down too
                _signal(self.pid, signal.SIGKILL)
                self.returncode = -signal.SIGKILL

    def poll(self) -> int | None:
        self._collect(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._collect(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        # The server reaps the child as it exits, so its pid could in principle be reused before
        # the status arrives here; poll first narrows that to the time between two system calls.
        if self.poll() is None:
            _signal(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


_PIPE, _DEVNULL, _STDOUT = subprocess.PIPE, subprocess.DEVNULL, subprocess.STDOUT


class WarmStarter:
    """The launcher's handle on its server: started on first use, restarted if it died."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._control: socket.socket | None = None

    def _ensure(self) -> socket.socket:
        """The socket to a live server, starting one if there is none."""
        with self._lock:
            if self._server_gone():
                self._reap()
                ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                code = "from planner.warm_start import serve_main; serve_main()"
                # PPLAN_PARENT_PID marks the server, and its children (whose /proc/PID/environ is the
                # server's), as this launcher's for whoever scans /proc for leftover processes
                env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")])),
                           **{PARENT_ENV: str(os.getpid())})
                self._proc = subprocess.Popen([sys.executable, "-c", code, str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL, env=env, start_new_session=True)
                if self._control is None:
                    atexit.register(self.close)
                else:
                    self._control.close()
                theirs.close()
                self._control = ours
            return self._control

    def _server_gone(self) -> bool:
        """No server, or one that exited or is exiting. A dying process closes its sockets before its
        exit status exists, so poll() alone once took a server killed a moment ago for a live one and
        sent it the next request; its hung-up end of the control socket says it is going."""
        if self._proc is None or self._control is None or self._proc.poll() is not None:
            return True
        watch = select.poll()
        watch.register(self._control, select.POLLHUP | select.POLLERR | getattr(select, "POLLRDHUP", 0))
        return bool(watch.poll(0))

    def _reap(self) -> None:
        """Collect a gone server's exit (a dying one within moments; one that hung up and lingers is killed)."""
        if self._proc is None:
            return
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def close(self) -> None:
        """End the server (and wait for it): its children are the launcher's to stop, and one
        still importing torch (started early, for a run that was then refused) is not waited for."""
        with self._lock:
            if self._control is not None:
                self._control.close()
            if self._proc is not None:
                self._proc.terminate()
                self._proc.wait()
            self._proc = self._control = None

    def start(self, target: str, args: Sequence[str], env: dict[str, str], *, name: str = "", cwd: str | Path | None = None,
              stdin: int | IO[Any] = _DEVNULL, stdout: int | IO[Any] | None = None,
              stderr: int | IO[Any] | None = None, text: bool = False) -> WarmProcess:
        """Fork a child that calls `target` ("module:function") with `args` and exits with what it
        returns, shown as `name` by ps and top; stdin/stdout/stderr as for Popen (PIPE, DEVNULL, STDOUT
        for stderr, an open file, or None to share the launcher's)."""
        request = json.dumps({"target": target, "args": list(args), "env": dict(env), "name": name,
                              "cwd": str(cwd or os.getcwd())}).encode()
        if len(request) > _MAX_REQUEST:
            raise RequestTooLarge(f"a start request of {len(request)} bytes, over {_MAX_REQUEST}")
        control = self._ensure()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        child_fds: list[int] = [theirs.detach()]  # every fd here is a copy the server receives: closed after sending
        parent_ends: list[IO[Any] | None] = []
        try:
            for i, spec in enumerate((stdin, stdout, stderr)):
                fd, parent_end = _child_fd(i, spec, child_fds[-1], text)
                child_fds.append(fd)
                parent_ends.append(parent_end)
            try:
                with self._lock:
                    socket.send_fds(control, [request], child_fds)
                data = mine.recv(_STATUS.size)
            except OSError:
                data = b""  # the server is gone
            if len(data) != _STATUS.size:
                raise RunError("the warm-start server exited before starting a process",
                               f"rerun; set {ENV_SWITCH}=0 to start every process fresh")
        except BaseException:
            for end in parent_ends:
                if end is not None:
                    end.close()
            mine.close()
            raise
        finally:
            for fd in child_fds:
                os.close(fd)
        return WarmProcess([target, *args], _STATUS.unpack(data)[0], mine, *parent_ends)


def _child_fd(index: int, spec: int | IO[Any] | None, previous: int, text: bool) -> tuple[int, IO[Any] | None]:
    """(a new fd the child gets as its fd `index`, the launcher's end of a pipe or None);
    `previous` is the fd given for index - 1 (what STDOUT means for stderr)."""
    if spec is None:
        return os.dup(index), None
    if spec == _DEVNULL:
        return os.open(os.devnull, os.O_RDWR), None
    if spec == _STDOUT:
        return os.dup(previous), None
    if spec == _PIPE:
        r, w = os.pipe()
        if index == 0:
            return r, os.fdopen(w, "w" if text else "wb", buffering=-1 if text else 0)
        return w, os.fdopen(r, "r" if text else "rb", buffering=-1 if text else 0)
    return os.dup(spec.fileno() if hasattr(spec, "fileno") else int(spec)), None  # type: ignore[arg-type, union-attr]


_ROOT = str(Path(__file__).resolve().parents[1])
_STARTER: WarmStarter | None = None
_STARTER_LOCK = threading.Lock()


def _starter() -> WarmStarter:
    global _STARTER
    with _STARTER_LOCK:
        if _STARTER is None:
            _STARTER = WarmStarter()
        return _STARTER


def prestart() -> None:
    """Start the server now, so that it imports torch while the launcher does its own checks."""
    if warm_start_enabled():
        _starter()._ensure()


def start_rank_process(target: str, args: Sequence[str], env: dict[str, str], name: str = "",
                       **popen: Any) -> WarmProcess | subprocess.Popen:
    """A started process in its own session, named `name`, that calls `target` ("module:function")
    with `args` and exits with what it returns: forked warm when enabled, else a fresh `python -c`;
    `popen` takes Popen's stdin, stdout, stderr, cwd and text."""
    if warm_start_enabled():
        try:
            return _starter().start(target, args, env, name=name, **popen)
        except RequestTooLarge:
            pass  # an environment too large for one message: this process starts fresh
    module, _, func = target.partition(":")
    # exits as the warm child does: no interpreter finalization (gloo's threads can abort it)
    code = (f"import os, sys; from planner.warm_start import set_process_name; set_process_name({name!r}); "
            f"from {module} import {func}; c = {func}(*sys.argv[1:]); sys.stdout.flush(); "
            "sys.stderr.flush(); os._exit(c if isinstance(c, int) else 0)")
    popen.setdefault("stdin", _DEVNULL)
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, start_new_session=True, **popen)
