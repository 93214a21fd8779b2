"""How much a plan file may hold, checked on the parsed JSON before any stage, device or link is built.

A plan may come from someone else. Before these bounds, a 61 MB plan listing 2.2 million stages
took 21-39 s and 1.1-1.3 GB of memory only to be refused (every stage was built, then validated).
Now every list's length is compared with what a plan can hold, each limit following from the plan
itself where it can (no more stages than layers, no more devices than stages, each layer recomputed
at most once, each device pair linked once), and text meant for a terminal is held to one safe line.
"""

from __future__ import annotations

from typing import Any

from planner.errors import PlanError, PplanError
from planner import textsafe
from planner.jsontypes import json_int
from planner.limits import MAX_MODEL_SPEC_CHARS

__all__ = [
    "MAX_PLAN_BYTES", "MAX_PIPELINE_STAGES", "MAX_PLAN_LAYERS", "MAX_LINK_PAIRS", "MAX_TEXT_CHARS",
    "MAX_PREDICTED_MS", "MAX_SEARCH_ROWS", "MAX_SKIPPED", "check_plan_counts", "check_text",
]

MAX_PLAN_BYTES = 16 * 2**20
"""Largest plan file read. The largest plan pplan can write, 4,000 layers on 4,000 devices with every
field filled (names, a recomputed layer per stage, a link per neighbour pair, a predicted record per
device, 6 runners-up and 4 baselines of 4,001 cuts each, 8,192 skipped lines), measured 4.97 MB
(2026-12-03; tests/test_hostile_plan_files.py builds it); 14,000 link pairs of a cluster's 8-GPU
node meshes add about 1.8 MB. 16 MiB is twice that and bounds what parsing a hostile file costs."""
MAX_PIPELINE_STAGES = 4_000
"""The most stages (so devices) one pipeline can have: every stage holds at least one layer, and a
profile holds at most planner.profiling.csvio.MAX_LAYERS (equal to it; tests/test_report_bounds.py checks)."""
MAX_PLAN_LAYERS = 4_000
"""The most layers a plan may cover: what a profile can hold (planner.profiling.csvio.MAX_LAYERS,
equal to it; tests/test_hostile_plan_files.py checks), without which a plan is neither simulated nor run."""
MAX_LINK_PAIRS = 100_000
"""The most `links.pairs` a plan may list (and `links` a cluster file), besides one per device pair:
a cluster writes one per link it lists. 4,000 devices in 8-GPU nodes with full meshes list 14,000;
a plan of 4,000 devices with 100,000 pairs (8.4 MB) loaded in 2.5 s, 128 MB (2026-12-03, 2-core machine)."""
MAX_TEXT_CHARS = MAX_MODEL_SPEC_CHARS
"""Longest free text a plan holds: its model spec (planner.limits; a profile path or a search note is
shorter). The file's MAX_PLAN_BYTES bounds them all together."""
MAX_PREDICTED_MS = 1e12
"""Longest time a prediction may state, ms (about 32 years): longer is a typo or a hostile file."""
MAX_SEARCH_ROWS = 1_000
"""The most `search.candidates` (and `search.baselines`) a plan may list. `pplan partition` writes at most
RUNNERS_UP (6) runners-up and a baseline per other method (4), the 3D search a row per plan it simulated
(fewer than its 400 pipeline solves). Rows are checked one by one: 150,000 took 44.6 s to load."""
MAX_SKIPPED = 100_000
"""The most `search.skipped` lines: the one-pipeline grid skips at most a line per schedule and
micro-batch count (8 x 1,024), the 3D search about two per layout (7,290 layouts for 720,720 GPUs)."""


def check_text(text: str, what: str, where: str, error: type[PplanError] = PlanError,
               limit: int = MAX_TEXT_CHARS) -> str:
    """planner.textsafe.check_text with a plan's bound: text longer than a name (a path, a note)."""
    return textsafe.check_text(text, what, error, where, limit)


def _count(value: Any) -> int | None:
    """len(value) when it is a JSON list, else None (a wrong type is named by the field's reader)."""
    return len(value) if isinstance(value, list) else None


def check_plan_counts(d: dict[str, Any]) -> None:
    """PlanError when a list of the plan object `d` is longer than such a plan can hold: `n_layers`
    beyond MAX_PLAN_LAYERS, more stages than layers (or MAX_PIPELINE_STAGES), more devices than a
    pipeline has, more link pairs than device pairs (or MAX_LINK_PAIRS). Only lengths are read: O(1).
    What a file holds within them (stage layers, recompute lists) is bounded as it is read (serialize)."""
    n_layers = json_int(d.get("n_layers"))
    if n_layers is not None and not 1 <= n_layers <= MAX_PLAN_LAYERS:
        raise PlanError(f"plan field n_layers {n_layers} is out of range (1 to {MAX_PLAN_LAYERS:,})",
                        f"a profile holds at most {MAX_PLAN_LAYERS:,} layers; group layers into blocks beyond that")
    n_stages = _count(d.get("stages"))
    most, why = (MAX_PIPELINE_STAGES, f"a pipeline has at most {MAX_PIPELINE_STAGES:,}")
    if n_layers is not None and n_layers < most:
        most, why = n_layers, f"the plan has n_layers {n_layers} and every stage holds a layer"
    if n_stages is not None and n_stages > most:
        raise PlanError(f"plan field stages lists {n_stages:,} stages, more than such a plan can have ({why})",
                        "every stage holds at least one layer: check the file")
    devices = d.get("devices")
    n_devices = _count(devices) if _count(devices) is not None else json_int(devices)
    if n_devices is not None and n_devices > MAX_PIPELINE_STAGES:  # fewer, but more than the stages: read, then refused
        listed = f"lists {n_devices} devices" if isinstance(devices, list) else f"is {n_devices}"
        has = (f"the plan has {n_stages} stages" if n_stages is not None
               else f"a pipeline has at most {MAX_PIPELINE_STAGES:,} devices")
        raise PlanError(f"plan field devices {listed} but {has}", "every device needs at least one stage")
    links = d.get("links")
    n_pairs = _count(links.get("pairs")) if isinstance(links, dict) else None
    possible = n_devices * (n_devices - 1) // 2 if n_devices is not None and n_devices >= 1 else None
    if n_pairs is not None and possible is not None and n_pairs > min(possible, MAX_LINK_PAIRS):
        raise PlanError(f"plan field links.pairs lists {n_pairs:,} pairs, more than the {possible:,} pairs of its "
                        f"{n_devices} devices (or {MAX_LINK_PAIRS:,})", "list each device pair at most once")
