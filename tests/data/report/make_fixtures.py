"""Regenerate the report test fixtures in this folder: `python tests/data/report/make_fixtures.py`.

A small gpt-like model (embedding, 4 blocks, LM head) on 2 devices under 1F1B with 4
micro-batches. The timeline comes from a tiny hand-written 1F1B walk so the fixtures do not
depend on the simulator; the measured files are the predicted ones, perturbed.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from planner.plan import plan_from_dict, write_plan
from planner.profiling.profile import make_profile, write_profile

HERE = Path(__file__).resolve().parent
MiB = 2**20


def profile():
    names = ["embed"] + [f"block{i}" for i in range(4)] + ["lm_head"]
    sizes = [1, 2]
    fwd = np.array([[0.4, 0.7], [2.0, 3.8], [2.0, 3.8], [2.0, 3.8], [2.0, 3.8], [3.0, 5.6]])
    cols = {
        "fwd_ms": fwd,
        "bwd_ms": fwd * 2,
        "param_bytes": np.array([[60 * MiB] * 2, [12 * MiB] * 2, [12 * MiB] * 2, [12 * MiB] * 2, [12 * MiB] * 2, [60 * MiB] * 2]),
        "activation_bytes": np.array([[1 * MiB, 2 * MiB], [6 * MiB, 12 * MiB], [6 * MiB, 12 * MiB], [6 * MiB, 12 * MiB], [6 * MiB, 12 * MiB], [24 * MiB, 48 * MiB]]),
        "output_bytes": np.array([[MiB // 2, MiB]] * 5 + [[8 * MiB, 16 * MiB]]),
    }
    return make_profile(names, sizes, cols, meta={"model": "gpt:layers=4,vocab=8192", "device": "cpu"})


def one_f_one_b(stage_f, stage_b, m, comm=0.2):
    """(device, stage, kind, mb, start, end) rows of a 1F1B iteration on len(stage_f) stages."""
    p = len(stage_f)
    orders = []
    for s in range(p):
        warm = min(p - s, m)
        order = [("F", i) for i in range(warm)]
        f, b = warm, 0
        while b < m:
            order.append(("B", b)); b += 1
            if f < m:
                order.append(("F", f)); f += 1
        orders.append(order)
    done = {}
    free = [0.0] * p
    rows = []
    idx = [0] * p
    while any(idx[s] < len(orders[s]) for s in range(p)):
        for s in range(p):
            while idx[s] < len(orders[s]):
                kind, mb = orders[s][idx[s]]
                if kind == "F":
                    dep = done.get((s - 1, "F", mb), 0.0) + (comm if s else 0.0) if s else 0.0
                    if s and (s - 1, "F", mb) not in done:
                        break
                else:
                    if (s, "F", mb) not in done or (s < p - 1 and (s + 1, "B", mb) not in done):
                        break
                    dep = done[(s + 1, "B", mb)] + comm if s < p - 1 else done[(s, "F", mb)]
                start = max(free[s], dep)
                end = start + (stage_f[s] if kind == "F" else stage_b[s])
                rows.append((s, s, kind, mb, start, end))
                if (kind == "F" and s < p - 1) or (kind == "B" and s > 0):
                    rows.append((s, s, "C", mb, end, end + comm))
                done[(s, kind, mb)] = end
                free[s] = end
                idx[s] += 1
    t = max(free)
    for s in range(p):
        rows.append((s, s, "O", -1, t, t + 1.0))
    return sorted(rows, key=lambda r: (r[0], r[4]))


def write_timeline(path, rows):
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["device", "stage", "kind", "microbatch", "start_ms", "end_ms"])
        for r in rows:
            w.writerow([r[0], r[1], r[2], r[3], f"{r[4]:.4f}", f"{r[5]:.4f}"])


def main():
    prof = profile()
    write_profile(prof, HERE / "profile.csv")
    costs = prof.at(2)
    cuts = [(0, 3), (3, 6)]
    f = [float(costs.fwd_ms[a:b].sum()) for a, b in cuts]
    bw = [float(costs.bwd_ms[a:b].sum()) for a, b in cuts]
    rows = one_f_one_b(f, bw, 4)
    write_timeline(HERE / "timeline.csv", rows)
    rng = np.random.default_rng(0)
    measured = [(d, s, k, mb, a * 1.12 + 0.3, a * 1.12 + 0.3 + (b - a) * (1.1 + 0.1 * rng.random())) for d, s, k, mb, a, b in rows]
    write_timeline(HERE / "measured_timeline.csv", measured)
    it = max(r[5] for r in rows)
    it_meas = max(r[5] for r in measured)
    limit = 1024 * MiB
    devices, timeline = [], {}
    for d, (a, b) in enumerate(cuts):
        params = float(costs.param_bytes[a:b].sum())
        act = float(costs.activation_bytes[a:b].sum()) * (2 - d)
        buf = 2 * float(costs.output_bytes[2]) * 2
        mem = {"weights": int(params), "gradients": int(params), "optimizer": int(2 * params),
               "activations": int(act), "buffers": int(buf)}
        mem["total"] = sum(mem.values())
        busy = sum(r[5] - r[4] for r in rows if r[0] == d and r[2] in "FBO")
        devices.append({"device": d, "name": f"cpu{d}", "busy_ms": round(busy, 4), "idle_ms": round(it - busy, 4),
                        "peak_memory_bytes": mem["total"], "memory": mem, "memory_limit_bytes": limit})
        static = 4 * params + buf
        level, pts = static, [[0.0, static]]
        per_mb = act / (2 - d)
        for r in rows:
            if r[0] == d and r[2] in "FB":
                level += per_mb if r[2] == "F" else -per_mb
                pts.append([round(r[5] if r[2] == "F" else r[5], 4), level])
        timeline[str(d)] = pts
    sim = {"iteration_ms": round(it, 4), "bubble_fraction": round(1 - sum(x["busy_ms"] for x in devices) / (2 * it), 4),
           "throughput_samples_per_s": round(8 / it * 1e3, 3), "schedule": "1f1b", "n_microbatches": 4,
           "micro_batch_size": 2, "interpolated": False, "devices": devices, "memory_timeline": timeline}
    (HERE / "sim.json").write_text(json.dumps(sim, indent=2) + "\n")
    uniform_peak = 1150 * MiB
    plan = plan_from_dict({
        "model": "gpt:layers=4,vocab=8192", "n_layers": 6, "schedule": "1f1b", "micro_batch_size": 2,
        "n_microbatches": 4, "devices": [{"name": "cpu0", "memory_bytes": limit}, {"name": "cpu1", "memory_bytes": limit}],
        "stages": [{"device": 0, "layers": [0, 3]}, {"device": 1, "layers": [3, 6], "recompute": [5]}],
        "predicted": {k: sim[k] for k in ("iteration_ms", "bubble_fraction", "throughput_samples_per_s")}
        | {"peak_memory_bytes": [d["peak_memory_bytes"] for d in devices]},
        "search": {"method": "dp", "baselines": [
            {"name": "uniform", "stages": [[0, 3], [3, 6]], "iteration_ms": round(it * 1.05, 3), "peak_memory_bytes": uniform_peak, "feasible": False},
            {"name": "params", "stages": [[0, 2], [2, 6]], "iteration_ms": round(it * 1.3, 3), "peak_memory_bytes": 900 * MiB, "feasible": True},
            {"name": "time", "stages": [[0, 4], [4, 6]], "iteration_ms": round(it * 1.1, 3), "peak_memory_bytes": 1100 * MiB, "feasible": False},
        ]},
    })
    write_plan(plan, HERE / "plan.json")
    steps = [it_meas * 1.6] + [it_meas * (1 + 0.04 * rng.standard_normal()) for _ in range(7)]
    run = {"iteration_ms_measured": round(float(np.median(steps[1:])), 4), "iteration_ms_predicted": round(it, 4),
           "error_pct": round((float(np.median(steps[1:])) - it) / it * 100, 2), "losses": [9.1, 8.7, 8.2, 7.9, 7.5, 7.3, 7.0, 6.8],
           "step_ms": [round(float(s), 4) for s in steps],
           "ranks": [{"rank": d["device"], "busy_ms": round(d["busy_ms"] * 1.15, 4),
                      "peak_memory_bytes_measured": int(d["peak_memory_bytes"] * 0.93),
                      "peak_memory_bytes_predicted": d["peak_memory_bytes"]} for d in devices]}
    (HERE / "run.json").write_text(json.dumps(run, indent=2) + "\n")


if __name__ == "__main__":
    main()
