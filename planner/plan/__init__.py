"""The plan: what to run where, and what the simulator predicts for it. JSON, versioned.

Minimal hand-written plan (everything else has defaults):

    {"schedule": "1f1b", "micro_batch_size": 4, "n_microbatches": 8, "devices": 2,
     "stages": [{"device": 0, "layers": [0, 3]}, {"device": 1, "layers": [3, 6]}]}

`layers` is half-open [first, end). With v stages per device (interleaved schedules) stage s
runs on device s mod n_devices. Written plans carry the format tag, model spec and seed,
the profile's path and checksum, device memory limits, links and the simulator's prediction.

Reading is strict: a key pplan does not know, at any level (PLAN_KEYS, DEVICE_KEYS, ... and the
fields of the `predicted` and `search` records), is refused with the nearest known one, and numbers
must lie in physically meaningful ranges (planner.limits). `global_batch` is derived and must
equal micro_batch_size x n_microbatches when given.

A written `predicted` records the plan it was made for (`made_for`: a short sha256 per group of the
fields its numbers depend on); a plan edited since reads without it, and `read_plan` says why.

Reading is bounded too: a plan file is at most 16 MiB, and every list's length is checked against
what such a plan can hold (no more stages than layers, ...) before any item is built; names and
other text must be one line a terminal can show (planner.plan.bounds).

Modules: model (Plan and its parts, valid by construction), checks (what valid means),
records (the typed `predicted` and `search`; recordbase their shared JSON round-trip), digest (what
plan a prediction is of), serialize (JSON read/write), fields (typed reads), bounds (how much a plan
file may hold), devicelist (which devices a listing for people shows).
"""

from planner.limits import (
    MAX_BANDWIDTH, MAX_GLOBAL_BATCH, MAX_LATENCY_MS, MAX_MEMORY_BYTES, MAX_SEED, MAX_SPEED, MIN_BANDWIDTH, MIN_SPEED,
)
from planner.plan.checks import OPTIMIZERS, SCHEDULES, validate_plan
from planner.plan.model import DEFAULT_BANDWIDTH, DEFAULT_LATENCY_MS, Device, Links, Plan, StagePlan
from planner.plan.records import (
    AtPlanSetting, BaselineRow, MemoryRecord, PlanDigest, PredictedDevice, Prediction, SearchRecord, SearchRow,
)
from planner.plan.serialize import (
    DEVICE_KEYS, FORMAT, LINKS_KEYS, MEMORY_KEYS, PAIR_KEYS, PLAN_KEYS, PREDICTED_DEVICE_KEYS, PREDICTED_KEYS,
    PROFILE_KEYS, SEARCH_KEYS, SEARCH_ROW_KEYS, STAGE_KEYS, load_plan, plan_from_dict, plan_to_dict, plan_to_json,
    write_plan,
)
from planner.plan.profile_path import require_profile_path, resolve_profile_path

__all__ = [
    "FORMAT", "SCHEDULES", "OPTIMIZERS", "DEFAULT_BANDWIDTH", "DEFAULT_LATENCY_MS",
    "Device", "StagePlan", "Links", "Plan",
    "Prediction", "PredictedDevice", "MemoryRecord", "PlanDigest", "SearchRecord", "SearchRow", "BaselineRow", "AtPlanSetting",
    "PLAN_KEYS", "PROFILE_KEYS", "DEVICE_KEYS", "LINKS_KEYS", "PAIR_KEYS", "STAGE_KEYS", "MEMORY_KEYS",
    "PREDICTED_DEVICE_KEYS", "PREDICTED_KEYS", "SEARCH_KEYS", "SEARCH_ROW_KEYS",
    "load_plan", "plan_from_dict", "plan_to_dict", "plan_to_json", "write_plan", "validate_plan", "resolve_profile_path", "require_profile_path",
    "MAX_BANDWIDTH", "MAX_GLOBAL_BATCH", "MAX_LATENCY_MS", "MAX_MEMORY_BYTES", "MAX_SEED", "MAX_SPEED",
    "MIN_BANDWIDTH", "MIN_SPEED",
]
