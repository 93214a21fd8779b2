"""What processor this is and how many cores we may use, read without torch (profile metadata,
bench headers, the demo's and `pplan run`'s thread counts), and another process's state."""

from __future__ import annotations

import os
import platform
from pathlib import Path

__all__ = ["cpu_model", "usable_cores", "load_average", "process_stat"]


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def load_average() -> float | None:
    """The 1-minute load average (None where the OS has none): recorded beside measurements,
    since a loaded machine measures slower and `pplan run` compares the two."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo, else what platform knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def process_stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the process name (state first, start time at index 19),
    or [] when the process is gone or there is no /proc."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []
