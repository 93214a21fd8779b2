"""What processor this is, read without torch (used by profile metadata and bench headers)."""

from __future__ import annotations

import platform

__all__ = ["cpu_model"]


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
