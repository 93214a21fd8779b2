"""The private torch and transformers names pplan relies on, looked up with one plain error.

pplan reaches a few private names: torch's `_PipelineScheduleRuntime` (and its `_load_csv`), which
runs the plan's own action order, the schedules' `_maybe_compute_loss`, whose time a stage's forward
counts, and transformers' `_model_mapping` of an auto class, which tells a config's task. The
dependencies have no upper bound, so a release that renames one would otherwise end a command in
an AttributeError traceback; looked up here, it ends in one line naming the name, the installed
version and the one pplan is tested with.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import Any

from planner.errors import PplanError

__all__ = ["TESTED_VERSIONS", "missing_private", "private_attr", "private_import"]

TESTED_VERSIONS = {"torch": "2.13", "transformers": "5.24"}
"""The releases pplan is tested with (the project's test suite runs on these)."""


def _installed(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


def _where(owner: Any) -> str:
    """`owner` as a dotted name: a module's, a class's, or an instance's class's."""
    if hasattr(owner, "__qualname__") or hasattr(owner, "__file__"):
        module = getattr(owner, "__module__", None)  # a module has none: its name is dotted already
        name = getattr(owner, "__qualname__", None) or owner.__name__
        return f"{module}.{name}" if module else name
    return _where(type(owner))


def missing_private(name: str, package: str) -> PplanError:
    """The error for a private `name` of `package` that its installed release lacks."""
    tested = TESTED_VERSIONS[package]
    return PplanError(f"{name} is missing from the installed {package} {_installed(package)}: pplan uses this private name, "
                      f"known to work with {package} {tested}",
                      f"install {package} {tested} (pip install '{package}=={tested}.*')")


def private_attr(owner: Any, name: str, package: str) -> Any:
    """getattr(owner, name) for a private name of `package` ('torch' or 'transformers'),
    PplanError (missing_private) where this release has none. None counts as none: transformers'
    auto classes inherit `_model_mapping = None` from their base, which is what a release that
    dropped the subclass's mapping would leave."""
    found = getattr(owner, name, None)
    if found is None:
        raise missing_private(f"{_where(owner)}.{name}", package)
    return found


def private_import(module: str, name: str, package: str) -> Any:
    """`from module import name` for a private name of `package`, PplanError where it is gone."""
    try:
        found = importlib.import_module(module)
    except ImportError:
        raise missing_private(module, package) from None
    return private_attr(found, name, package)
