"""The model a plan names, built as `pplan run` builds it: for users' own training loops.

`build_plan_model(plan, plan_path)` refuses a `module:factory` model the plan file alone names
(planner.models.trust: a plan someone sent you must not run code you did not ask for), then builds
the model in the dtype and with the input its profile records (planner.execute.preflight.model_kwargs:
a bfloat16 profile's model is bfloat16; a factory model's input shape comes from the profile), from
the plan's seed, so every rank holds the same weights and the losses equal `pplan run`'s.
"""

from __future__ import annotations

import os
from typing import Any

from planner.execute.preflight import model_kwargs
from planner.models import build_model
from planner.models.trust import check_model_trusted
from planner.plan import Plan
from planner.plan.profile_path import resolve_profile_path
from planner.profiling.profile import load_profile

__all__ = ["build_plan_model"]


def build_plan_model(plan: Plan, plan_path: str | os.PathLike | None = None, *, model: str | None = None,
                     trust_model: bool = False) -> Any:
    """The plan's model bundle (layers, loss_fn, make_batch), as `pplan run` builds it.

    model        the plan's model spec, repeated to vouch for a module:factory model (`--model`)
    trust_model  run the plan's module:factory model as it is (`--trust-model`)
    plan_path    where the plan was read from: its recorded profile path is relative to it; without
                 a profile there (or no path), the model is built as its spec alone says (float32)
    Raises ModelSpecError (one line) for a model refused or not buildable.
    """
    source = f"plan {str(plan_path)!r}" if plan_path is not None else "the plan"
    check_model_trusted(plan.model, model, trust_model, source=source)
    profile_path = resolve_profile_path(plan, plan_path)
    profile = load_profile(profile_path) if profile_path is not None and profile_path.exists() else None
    return build_model(plan.model, seed=plan.seed, **model_kwargs(profile))
