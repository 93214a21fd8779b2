"""Atomic file output: write to a temporary file beside the target, then rename.

An interrupted command (SIGINT, a crash, a full disk) never leaves a half-written profile,
plan or report behind: either the old file (or none) or the complete new one exists. The
temporary file is removed as the exception unwinds; the command line (cli/app.py) turns SIGTERM
and SIGHUP into such an exception too. Only SIGKILL (or a power cut) leaves one behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import threading
from pathlib import Path
from typing import Iterable, Iterator, TextIO

from planner.errors import PplanError

__all__ = ["atomic_write_text", "atomic_write_bytes", "atomic_open", "ensure_writable_file", "ensure_writable_dir",
           "ensure_outputs_distinct", "resolved_path", "stop_signals_held"]


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w") -> Iterator[TextIO]:
    """Open a temporary file next to `path`; rename it onto `path` only if the block succeeds."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8", "newline": ""})) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        # mkstemp creates 0600 files; give the result the permissions a plain open() would.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically."""
    with atomic_open(path, "w") as fh:
        fh.write(text)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` atomically."""
    with atomic_open(path, "wb") as fh:
        fh.write(data)


# The signals that ask a command to stop: Ctrl-C, kill's default, a closed terminal.
_STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


@contextlib.contextmanager
def stop_signals_held() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP while the block runs and deliver them when it ends, so that
    a stop lands before or after the block, never inside it: for the few renames that replace
    several files as one (a report's figures/ and index).

    A handler that only notes the signal stands in for whatever acts on it (the ignored ones stay
    ignored), and each one noted is raised again once every handler is back. Not
    signal.pthread_sigmask: it blocks the signal for the calling thread alone, and the kernel hands
    a signal the main thread blocks to another thread (numpy's BLAS thread), whose handler still
    interrupts the main thread; a Python handler always runs in the main thread. Outside the main
    thread (which alone may set handlers) nothing is held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    # ExitStack: every handler is put back even if a signal arrives, and raises, while others are
    # being restored; the noted signals are raised last, once all of them are back.
    with contextlib.ExitStack() as restore:
        restore.callback(_raise_each, noted)
        for sig in _STOP_SIGNALS:
            handler = signal.getsignal(sig)
            if handler in (signal.SIG_IGN, None):  # ignored, or a handler set outside Python: left alone
                continue
            restore.callback(signal.signal, sig, handler)
            signal.signal(sig, lambda signum, _frame: noted.append(signum))
        yield


def _raise_each(signals: list[int]) -> None:
    for sig in dict.fromkeys(signals):
        signal.raise_signal(sig)


def _first_existing(path: Path) -> Path:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _probe_dir(folder: Path, what: str, target: Path) -> None:
    """Create (and remove) a temporary file in `folder`: the only test that holds for root too."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".pplan-probe.", dir=folder)
    except OSError as e:
        raise PplanError(f"cannot write {what} {str(target)!r}: {folder} is not writable ({e.strerror})", "choose a writable path") from None
    os.close(fd)
    os.unlink(tmp)


def ensure_writable_dir(path: str | os.PathLike, what: str) -> None:
    """Refuse, before any work starts, a folder that cannot be created or written.

    Creates nothing that stays: the nearest existing ancestor is probed with a temporary file.
    """
    _check_folder(Path(path), what, Path(path))


def _check_folder(folder: Path, what: str, target: Path) -> None:
    existing = _first_existing(folder)
    if not existing.is_dir():
        raise PplanError(f"cannot write {what} {str(target)!r}: {str(existing)!r} is not a folder", "choose a path under a folder")
    _probe_dir(existing, what, target)


def ensure_writable_file(path: str | os.PathLike, what: str) -> None:
    """Refuse, before any work starts, an output file that could not be written at the end."""
    target = Path(path)
    if target.is_dir():
        raise PplanError(f"cannot write {what} {str(target)!r}: it is a folder", "give a file name")
    if target.exists() and not target.is_file():
        raise PplanError(f"cannot write {what} {str(target)!r}: it is not a regular file", "give a file name")
    _check_folder(target.parent, what, target)


def resolved_path(path: str | os.PathLike) -> Path:
    """`path` absolute with its symlinks followed, as far as they lead; never raises. Path.resolve()
    raises RuntimeError on a symlink loop (Python 3.11), which a comparison of paths made before the
    file is read turned into a traceback; the reader then names the loop in one line."""
    try:
        return Path(os.path.realpath(path))
    except (OSError, ValueError):  # a NUL in a path read from a file: no file has that name
        return Path(os.path.abspath(path))


def _same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file: the inode where both exist (hard links, symlinks, `./x`
    against `x`), else the resolved paths (an output that does not exist yet, a symlink loop)."""
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:  # unreadable metadata: compare the paths instead
        pass
    return resolved_path(a) == resolved_path(b)


def ensure_outputs_distinct(outputs: Iterable[tuple[str, str | os.PathLike | None]],
                            inputs: Iterable[tuple[str, str | os.PathLike | None]] = ()) -> None:
    """Refuse, before any work starts, an output that is one of the command's inputs or another output.

    `outputs` are (flag, path) pairs such as ("--timeline", "t.csv"); `inputs` are (what, path)
    pairs such as ("profile", "mlp.csv"). None entries are skipped. Without this, writing the
    output atomically replaces the input (`simulate plan.json --out plan.json` turned the plan
    into a simulation JSON), and two outputs on one path keep only the last one written.
    """
    outs = [(flag, Path(p)) for flag, p in outputs if p is not None]
    for what, src in ((w, Path(p)) for w, p in inputs if p is not None):
        for flag, dst in outs:
            if _same_file(dst, src):
                raise PplanError(f"{flag} {str(dst)!r} is the {what} this command reads", "choose another path")
    for i, (flag, dst) in enumerate(outs):
        for other, dst2 in outs[i + 1:]:
            if _same_file(dst, dst2):
                raise PplanError(f"{flag} {str(dst)!r} is also {other}: one would overwrite the other", "choose another path")
