"""Every rank of a job trains the same plan with the same settings, or none trains.

Under torchrun each node types its own `pplan run` command line. A node given another plan file
(other cuts over layers of the same width) joins the job like any other, and the pipeline then
trains a model nobody planned without a word: measured here, two nodes given 2-layer cuts at
layer 2 and at layer 1 trained side by side, loss 5.0017 -> 4.9380 instead of 5.0034 -> 4.9241.
Other --steps, --lr or another checkpoint to resume from make one node wait for a step its
peers never take. (Another --device is not among the terms: a cuda node joins over NCCL and a cpu
node over gloo, so they never meet here; they fail to join after --timeout.) So right after joining the process group the ranks exchange what they are
about to run (agree_on_job), and every rank refuses with the same line, naming the first rank
that differs from rank 0 and what differs. The local launcher hands every rank one config, where
the exchange agrees at once.
"""

from __future__ import annotations

import hashlib
import json
import socket
from dataclasses import dataclass
from typing import Any

from planner.errors import PplanError

__all__ = ["JobTerms", "job_terms", "first_disagreement", "agree_on_job", "check_same_plan", "plan_digest"]

# Run options every rank must share, by the flag a user sets them with. The others (--timeout,
# --threads, --verbose, --out, --timeline) are each process's own business.
_SHARED_OPTIONS = (("steps", "--steps"), ("warmup", "--warmup"), ("lr", "--lr"), ("calibrate", "--calibrate"),
                   ("prefer_torch", "--runtime"), ("checkpoint_every", "--checkpoint-every"),
                   ("input_shape", "--input-shape"), ("input_dtype", "--input-dtype"), ("vocab", "--vocab"),
                   ("track_memory", "track_memory"))


@dataclass(frozen=True)
class JobTerms:
    """What one rank is about to run, small enough to gather from every rank of a large job."""

    rank: int
    """The rank that reported these terms."""
    host: str
    """Its host name, for the message."""
    plan_sha256: str
    """Digest of the whole plan as this rank read it."""
    plan_parts: tuple[tuple[str, str], ...]
    """(top-level plan key, digest of its value): names what differs when the digests do."""
    settings: tuple[tuple[str, str], ...]
    """(flag, value as text) of the options and derived settings every rank must share."""


def _digest(value: Any) -> str:
    return plan_digest(value).hex()



def job_terms(cfg: dict[str, Any], rank: int, host: str | None = None) -> JobTerms:
    """The terms of the worker config `cfg` (planner.execute.run._launch builds it) on `rank`."""
    plan = cfg["plan"]
    options = cfg.get("options") or {}
    settings = [(flag, repr(options.get(key))) for key, flag in _SHARED_OPTIONS]
    settings.append(("the model's input (--input-shape/--input-dtype/--vocab or the profile's record)",
                     repr(sorted((cfg.get("model_kwargs") or {}).items()))))
    resume = cfg.get("resume")
    if resume is not None:  # chosen per rank from its own --checkpoint-dir
        settings.append(("the step resumed from (--checkpoint-dir)", repr(resume.get("step"))))
    parts = tuple((str(k), _digest(v)) for k, v in sorted(plan.items()))
    return JobTerms(rank=rank, host=host if host is not None else socket.gethostname(), plan_sha256=_digest(plan),
                    plan_parts=parts, settings=tuple(settings))


def first_disagreement(terms: list[JobTerms]) -> PplanError | None:
    """The refusal every rank raises when a rank's terms differ from rank 0's; None when all agree."""
    lead = terms[0]
    differ = [t for t in terms[1:] if t.plan_sha256 != lead.plan_sha256 or t.settings != lead.settings]
    if not differ:
        return None
    other = differ[0]
    more = f" (and {len(differ) - 1} more rank(s))" if len(differ) > 1 else ""
    who = f"rank {other.rank} on {other.host}{more} and rank 0 on {lead.host}"
    hint = "give every node the same plan file and the same `pplan run` options, then start the job again"
    if other.plan_sha256 != lead.plan_sha256:
        mine, theirs = dict(lead.plan_parts), dict(other.plan_parts)
        keys = sorted(set(mine) | set(theirs), key=lambda k: (k not in ("stages", "cuts", "parallel"), k))
        parts = [k for k in keys if mine.get(k) != theirs.get(k)]
        return PplanError(f"{who} were given different plans: they differ in {', '.join(repr(p) for p in parts)} "
                          f"(plan sha256 {other.plan_sha256[:12]} vs {lead.plan_sha256[:12]})", hint)
    for (flag, value), (_, lead_value) in zip(other.settings, lead.settings):
        if value != lead_value:
            return PplanError(f"{who} run the plan with different settings: {flag} {value} vs {lead_value}", hint)
    return PplanError(f"{who} run the plan with different settings", hint)  # settings of other lengths


def agree_on_job(cfg: dict[str, Any], rank: int, world: int) -> None:
    """Exchange this rank's terms with every rank of the joined process group; raise the same
    refusal on every rank when any differs (one small all-gather, before anything is built)."""
    import torch.distributed as dist

    mine = job_terms(cfg, rank)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine)
    refusal = first_disagreement(gathered)
    if refusal is not None:
        raise refusal


def plan_digest(plan_dict: Any) -> bytes:
    """The 32-byte sha256 of a plan (or a part of one) as JSON with sorted keys: equal for equal
    plans on any host."""
    return hashlib.sha256(json.dumps(plan_dict, sort_keys=True, default=str).encode("utf-8")).digest()


def check_same_plan(plan_dict: dict[str, Any], device: Any) -> None:
    """Refuse, on every rank of the joined group, a plan that differs from rank 0's: what
    build_pipeline does for a training loop of one's own (started on every machine with its own
    plan file). Tensors on `device` rather than pickled objects, so it runs over NCCL without a
    current CUDA device being set."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    mine = torch.tensor(list(plan_digest(plan_dict)), dtype=torch.uint8, device=device)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    lead = bytes(every[0].tolist())
    differ = [r for r, d in enumerate(every) if bytes(d.tolist()) != lead]
    if differ:
        theirs = bytes(every[differ[0]].tolist())
        more = f" (and {len(differ) - 1} more rank(s))" if len(differ) > 1 else ""
        raise PplanError(f"rank {differ[0]}{more} was given another plan than rank 0 (plan sha256 {theirs.hex()[:12]} "
                         f"vs {lead.hex()[:12]})", "give every machine the same plan file, then start the job again")
