"""What a plan's recorded prediction was made for: per group of plan fields the simulator's numbers
depend on, a short sha256 of their canonical JSON (PlanDigest, written as `predicted.made_for`).

A Plan stamps a prediction that has none when the two are joined (planner.plan.model); the reader
compares a stamped one with the plan around it and drops it, naming the groups that changed
(planner.plan.serialize.read_plan). So an edit of the cuts, recompute sets, devices, links,
optimizer, parallel layout (its hardware's values included), model or profile checksum is seen, in a file edited by hand or in a plan
changed in memory and written again.

Left out, because they label and change no predicted number: device names, the seed and the
profile's path. The model string is in (with the profile's checksum): it decides what `pplan run`
builds, so a prediction from one model's profile does not describe another's run. The digests decide only whether the stored numbers are trusted; a file
may lie about them, and nothing else reads them.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from planner.plan.records import DIGEST_HEX, PlanDigest

if TYPE_CHECKING:
    from planner.plan.model import Plan

__all__ = ["DIGEST_HEX", "plan_digest", "digest_change"]

_WORDS = {
    "batch": "schedule or batch split",
    "optimizer": "optimizer",
    "parallel": "parallel layout or its hardware",
    "devices": "devices (count, memory or speed)",
    "links": "links",
    "stages": "stages (cuts, recompute or devices)",
    "profile": "model or profile checksum",
}
"""Each PlanDigest field in the words of the note that drops a prediction."""


def _groups(plan: Plan) -> dict[str, Any]:
    """Each PlanDigest field's plan values, JSON-ready."""
    links = plan.links
    return {
        "batch": [plan.schedule, plan.micro_batch_size, plan.n_microbatches],
        "optimizer": plan.optimizer,
        "parallel": plan.parallel.to_dict() if plan.parallel is not None else None,
        "devices": [[dv.memory_bytes, dv.speed] for dv in plan.devices],
        "links": [links.bandwidth_bytes_per_s, links.latency_ms, [list(pair) for pair in links.pairs]],
        "stages": [[st.device, list(st.layers), list(st.recompute)] for st in plan.stages],
        "profile": [plan.model, plan.profile_sha256],
    }


def _canonical(value: Any) -> Any:
    """`value` with every whole float as an int: a speed of 1 built in Python and 1.0 read from JSON
    are the same plan, and must hash alike."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    return value


def _sha(value: Any) -> str:
    text = json.dumps(_canonical(value), sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_HEX]


def plan_digest(plan: Plan) -> PlanDigest:
    """The digest of `plan` as it is now."""
    return PlanDigest(**{name: _sha(value) for name, value in _groups(plan).items()})


def digest_change(recorded: PlanDigest, plan: Plan, skip: tuple[str, ...] = ()) -> str | None:
    """None when every digest `recorded` holds matches `plan` (one in `skip` is not checked; a file's
    made_for holds every group: PlanDigest.from_dict); else the groups that differ, in words
    ("stages (cuts, recompute or devices) and links")."""
    now = plan_digest(plan)
    changed = [_WORDS[name] for name in PlanDigest.keys() if name not in skip
               and getattr(recorded, name) is not None and getattr(recorded, name) != getattr(now, name)]
    if not changed:
        return None
    return changed[0] if len(changed) == 1 else ", ".join(changed[:-1]) + " and " + changed[-1]
