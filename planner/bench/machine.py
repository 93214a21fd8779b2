"""The machine a benchmark ran on: CPU, cores, memory, load, library versions, date.

Read from /proc and package metadata only: describing the machine must not import torch
(the planner and simulator benches never need it) nor take measurable time.
"""

from __future__ import annotations

import datetime as _dt
import platform
from importlib import metadata
from typing import Any

from planner.hostinfo import cpu_model, load_average, usable_cores

__all__ = ["machine_info"]


def _ram_gib() -> float | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) * 1024 / 2**30, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _ilp_solver() -> str:
    try:
        from planner.partition.ilp import ilp_solver_name

        return ilp_solver_name()
    except Exception:  # an optional detail: a broken PuLP install must not stop a bench
        return "unavailable"


def machine_info(with_solver: bool = True) -> dict[str, Any]:
    """Flat dict of strings and numbers, in a stable key order (CSV header lines, Markdown)."""
    load = load_average()
    info: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "cpu": cpu_model(),
        "cores": usable_cores(),
        "ram_gib": _ram_gib(),
        "load_1min": load,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "torch": _version("torch"),
        "numpy": _version("numpy"),
        "pulp": _version("pulp"),
    }
    if with_solver:
        info["ilp_solver"] = _ilp_solver()
    return info
