"""Regenerate the report test fixtures in this folder: `python tests/data/report/make_fixtures.py`.

A small hand-written gpt-like profile (embedding, 6 blocks, LM head with a large vocabulary),
planned with the real partitioner under the limit `pplan demo` would choose, simulated with the
real simulator. The "measured" files imitate `pplan run`'s output (its keys, not its process
launch): the simulated timeline and numbers, perturbed deterministically.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from planner.demo import DemoSettings, choose_memory_limit
from planner.partition.api import partition
from planner.partition.search import PartitionSettings
from planner.plan import write_plan
from planner.profiling.profile import load_profile, make_profile, write_profile
from planner.simulate import simulate
from planner.simulation.result import TimelineRow
from planner.simulation.timeline import write_timeline

HERE = Path(__file__).resolve().parent
MiB = 2**20


def _profile():
    names = ["embed"] + [f"block{i}" for i in range(6)] + ["norm_head"]
    sizes = [1, 2, 4]
    per_sample_fwd = np.array([0.05] + [1.0] * 6 + [4.0])
    fwd = np.outer(per_sample_fwd, sizes) * 0.9 + 0.1
    act = np.outer([0.01] + [0.5] * 6 + [4.0], sizes) * MiB
    out = np.outer([0.25] * 7 + [4.0], sizes) * MiB
    cols = {
        "fwd_ms": fwd, "bwd_ms": fwd * 2.0,
        "param_bytes": np.outer([4.0] + [0.75] * 6 + [4.0], [1] * len(sizes)) * MiB,
        "activation_bytes": act.round(), "output_bytes": out.round(),
    }
    meta = {"model": "gpt:layers=6,hidden=64,heads=2,seq=64,vocab=16384", "device": "cpu", "seed": "0",
            "input_bytes_per_sample": "512"}
    return make_profile(names, sizes, cols, meta=meta)


def _measured(rows, rng):
    """The simulated rows stretched and jittered like a real run (same order, later starts)."""
    out = []
    for r in rows:
        stretch = 1.15 + 0.08 * rng.random()
        out.append(TimelineRow(r.device, r.stage, r.kind, r.microbatch, r.start_ms * 1.18 + 0.4,
                               r.start_ms * 1.18 + 0.4 + (r.end_ms - r.start_ms) * stretch))
    return out


def main():
    write_profile(_profile(), HERE / "profile.csv")
    profile = load_profile(HERE / "profile.csv")
    settings = DemoSettings(model=profile.meta["model"], micro_batch_sizes=(1, 2, 4), global_batch=8,
                            n_microbatches=4, n_devices=2, steps=8, warmup=2, profile_repeats=1, profile_warmup=0)
    limit = choose_memory_limit(profile, settings)
    result = partition(profile, PartitionSettings(n_devices=2, memory_bytes=limit.limit_bytes, global_batch=8,
                                                  microbatches=4))
    plan = result.plan.with_(profile_path="profile.csv")
    write_plan(plan, HERE / "plan.json")
    sim = simulate(plan, profile)
    (HERE / "sim.json").write_text(json.dumps(sim.to_dict(), indent=2) + "\n")
    write_timeline(sim.timeline, HERE / "timeline.csv")
    rng = np.random.default_rng(0)
    measured = [r for r in _measured(sim.timeline, rng) if r.kind != "C"]  # a run records no transfers (C rows)
    write_timeline(measured, HERE / "measured_timeline.csv")
    it = max(r.end_ms for r in measured)
    steps = [it * 1.7, it * 1.1] + [it * (1 + 0.03 * rng.standard_normal()) for _ in range(6)]
    med = float(np.median(steps[2:]))
    d = sim.to_dict()
    ranks = []
    for dev in d["devices"]:
        busy = sum(r.end_ms - r.start_ms for r in measured if r.device == dev["device"] and r.kind in "FBIWRO")
        mem = {k: int(v * (1.0 if k != "activations" else 0.9)) for k, v in dev["memory"].items() if k != "total"}
        mem["total"] = sum(mem.values())
        ranks.append({"rank": dev["device"], "device": dev["device"], "host": "fixture",
                      "stages": [s for s, st in enumerate(plan.stages) if st.device == dev["device"]],
                      "busy_ms": round(busy, 4), "busy_ms_predicted": dev["busy_ms"],
                      "peak_memory_bytes_measured": mem["total"], "peak_memory_bytes_predicted": dev["peak_memory_bytes"],
                      "memory_measure": "tracked", "memory_measured": mem, "memory_predicted": dev["memory"]})
    run = {"format": "pplan-run/1", "plan": "plan.json", "model": plan.model, "schedule": plan.schedule,
           "device_type": "cpu", "n_ranks": 2, "n_stages": plan.n_stages, "micro_batch_size": plan.micro_batch_size,
           "n_microbatches": plan.n_microbatches, "steps": 8, "warmup": 2,
           "iteration_ms_measured": round(med, 4), "iteration_ms_predicted": sim.iteration_ms,
           "error_pct": round(100 * (sim.iteration_ms - med) / med, 3),
           "losses": [9.7, 9.6, 9.3, 9.1, 8.8, 8.6, 8.5, 8.3], "loss_steps": list(range(1, 9)),
           "step_ms": [round(float(x), 4) for x in steps], "measured_steps": list(range(2, 8)), "timeline_step": 5,
           "ranks": ranks}
    (HERE / "run.json").write_text(json.dumps(run, indent=2) + "\n")
    print(f"limit {limit.limit_bytes / MiB:.2f} MiB ({limit.rule}); plan {[st.layers for st in plan.stages]} "
          f"{plan.schedule}; baselines {[(b.method, b.fits) for b in plan.search.baselines]}")


if __name__ == "__main__":
    main()
