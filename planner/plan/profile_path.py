"""Where a plan's profile is: recorded from the plan's folder when the plan is written, looked for
there first when it is read (then from the working folder, as plans written before recorded it),
so a plan finds its profile from any folder and travels with it."""

from __future__ import annotations

import os
from pathlib import Path

from planner.errors import PlanError
from planner.plan.model import Plan

__all__ = ["profile_path_from", "resolve_profile_path", "require_profile_path"]


def profile_path_from(plan: Plan, path: str | os.PathLike) -> Plan:
    """`plan` with its relative profile path made relative to the folder of `path`, the plan file,
    when it names a file from the working folder (one that names none there may already be written
    from the plan's folder, as a plan built in Python for a profile beside it is)."""
    recorded = plan.profile_path
    if not recorded or os.path.isabs(recorded) or not os.path.isfile(recorded):
        return plan
    # from the folders as they are on disk: the plan's folder may be reached through a link, and a
    # '..' read from it climbs from where the link points
    profile = os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(recorded))), os.path.basename(recorded))
    rel = os.path.relpath(profile, os.path.realpath(os.path.dirname(os.path.abspath(path))))
    return plan if rel == recorded else plan.with_(profile_path=rel)


def resolve_profile_path(plan: Plan, plan_path: str | os.PathLike | None, override: str | None = None) -> Path | None:
    """The plan's profile: `override` (--profile), else the recorded path: absolute as it is; relative,
    from the plan file's folder (write_plan records it so, and plans travel with their profiles),
    else from the working folder (a plan written before paths were recorded from its folder); when
    neither exists, the path from the plan's folder, which the error then names."""
    if override:
        return Path(override)
    if not plan.profile_path:
        return None
    p = Path(plan.profile_path)
    if p.is_absolute() or plan_path is None:
        return p
    beside = Path(plan_path).parent / p
    if not beside.exists() and p.exists():
        return p
    # 'sub/../g.csv' shown as 'g.csv' where that is the same file (not so when sub is a link)
    tidy = Path(os.path.normpath(beside))
    return tidy if tidy.exists() and beside.exists() and os.path.samefile(tidy, beside) else beside


def require_profile_path(plan: Plan, plan_path: str | os.PathLike, override: str | os.PathLike | None = None) -> Path:
    """resolve_profile_path for a command that needs the profile: PlanError when the plan names
    none, or when the one it names is not there (naming where it was looked for); a --profile given
    is the caller's to check, as any input file."""
    path = resolve_profile_path(plan, plan_path, str(override) if override else None)
    if path is None:
        raise PlanError(f"plan {str(plan_path)!r} names no profile", "pass --profile PROFILE.csv")
    if not override and not path.exists():
        raise PlanError(f"the profile plan {str(plan_path)!r} names, {plan.profile_path!r}, is not at {str(path)!r} "
                        "(a relative path is read from the plan's folder, then the working folder)",
                        "pass --profile PROFILE.csv, or put the profile there")
    return path
