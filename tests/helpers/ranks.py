"""Finding the processes a `pplan run` launcher started, by scanning /proc (no psutil).

A rank is found whether it was forked by the warm-start server or started fresh: its
/proc/PID/environ names the launcher (PPLAN_PARENT_PID; a forked rank shows the server's
environment, which the launcher marks so), and its name (/proc/PID/comm) is `pplan-rank<R>`.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["alive", "launcher_processes", "rank_pids"]


def _stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the name (state first), or [] when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(kv.split("=", 1) for kv in raw.decode("utf-8", "replace").split("\0") if "=" in kv)


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie has exited; its parent only has not reaped it yet)."""
    fields = _stat(pid)
    return bool(fields) and fields[0] != "Z"


def launcher_processes(launcher: int) -> list[int]:
    """Live processes started for the launcher: its process group, or marked as its own."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == launcher:
            continue
        pid = int(entry.name)
        fields = _stat(pid)
        if not fields or fields[0] == "Z":
            continue
        if fields[2] == str(launcher) or _environ(pid).get("PPLAN_PARENT_PID") == str(launcher):
            found.append(pid)
    return found


def rank_pids(launcher: int) -> dict[int, int]:
    """RANK -> pid of the launcher's live rank processes."""
    out = {}
    for pid in launcher_processes(launcher):
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if name.startswith("pplan-rank") and name[len("pplan-rank"):].isdigit():
            out[int(name[len("pplan-rank"):])] = pid
    return out
