#!/usr/bin/env bash
# GPU check of the executor (needs one CUDA device; about 2-5 minutes, at most 10).
#
#   scripts/gpu-check.sh            # results under reports/gpu/
#
# 1. profile a GPT on cuda            -> reports/gpu/profile.csv
# 2. plan it for one device twice     -> plan.json (no recompute), plan-recompute.json (all layers)
# 3. run each plan on the GPU         -> run*.json, timeline*.csv  (--calibrate on the first)
# 4. compare the CUDA allocator's peak with the predicted peak memory, and the step time with
#    the prediction                   -> summary.md, summary.json
#
# Exit status: 0 done (the numbers are in summary.md, nothing is asserted), 77 skipped (no CUDA
# device or no torch with CUDA), 1 a step failed (its log is in reports/gpu/*.log).
# Environment: PYTHON (default .venv/bin/python, else python3), MODEL, OUT_DIR, STEPS;
# DEVICE=cpu runs the same steps on the CPU (a dry run of this script with a small MODEL).
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
OUT=${OUT_DIR:-reports/gpu}
MODEL=${MODEL:-gpt:layers=8,hidden=1024,heads=16,seq=512,vocab=32000}
STEPS=${STEPS:-12}
DEVICE=${DEVICE:-cuda}

if [ "$DEVICE" = cuda ] && ! "$PY" - <<'EOF'
import sys
try:
    import torch
except Exception as e:  # no torch at all
    print(f"gpu-check: skipped: torch does not import ({e})", file=sys.stderr); sys.exit(1)
if not torch.cuda.is_available():
    print(f"gpu-check: skipped: no CUDA device (torch {torch.__version__}, cuda build: {torch.version.cuda})", file=sys.stderr)
    sys.exit(1)
EOF
then
    exit 77
fi
mkdir -p "$OUT"

step() {  # step NAME SECONDS CMD... : run with a time limit, log to $OUT/NAME.log, stop on failure
    local name=$1 limit=$2; shift 2
    echo "gpu-check: $name" >&2
    if ! timeout "$limit" "$@" >"$OUT/$name.log" 2>&1; then
        echo "gpu-check: $name failed (exit $?); last lines of $OUT/$name.log:" >&2
        tail -n 15 "$OUT/$name.log" >&2
        exit 1
    fi
}

"$PY" -c "
import torch
if '$DEVICE' == 'cuda':
    p = torch.cuda.get_device_properties(0)
    print(f'device: {p.name}, {p.total_memory/2**30:.1f} GiB, torch {torch.__version__}, cuda {torch.version.cuda}')
else:
    print(f'device: cpu (dry run), torch {torch.__version__}')" | tee "$OUT/env.txt" >&2
rm -f "$OUT/profile.calibration.json"
step profile 240 "$PY" -m cli.app profile --model "$MODEL" --device "$DEVICE" -b 1,2,4,8 --warmup 2 --repeats 5 --out "$OUT/profile.csv"
step partition 60 "$PY" -m cli.app partition "$OUT/profile.csv" -n 1 --global-batch 32 --microbatches 4 --schedule gpipe --recompute none --out "$OUT/plan.json"
step partition-recompute 60 "$PY" -m cli.app partition "$OUT/profile.csv" -n 1 --global-batch 32 --microbatches 4 --schedule gpipe --recompute all --out "$OUT/plan-recompute.json"
step run 180 "$PY" -m cli.app run "$OUT/plan.json" --device "$DEVICE" --steps "$STEPS" --warmup 3 --threads 1 --calibrate --out "$OUT/run.json" --timeline "$OUT/timeline.csv"
step run-recompute 180 "$PY" -m cli.app run "$OUT/plan-recompute.json" --device "$DEVICE" --steps "$STEPS" --warmup 3 --threads 1 --out "$OUT/run-recompute.json" --timeline "$OUT/timeline-recompute.csv"

"$PY" - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
rows, summary = [], {"env": (out / "env.txt").read_text().strip(), "runs": []}
for name in ("run.json", "run-recompute.json"):
    run = json.loads((out / name).read_text())
    r = run["ranks"][0]
    meas, pred = r["peak_memory_bytes_measured"], r["peak_memory_bytes_predicted"]
    mem_err = None if not (meas and pred) else 100 * (pred - meas) / meas
    entry = {"run": name, "memory_measure": r["memory_measure"], "peak_measured_bytes": meas, "peak_predicted_bytes": pred,
             "memory_error_pct": mem_err, "tracked_bytes": (r["memory_measured"] or {}).get("total"),
             "iteration_ms_measured": run["iteration_ms_measured"], "iteration_ms_predicted": run["iteration_ms_predicted"],
             "time_error_pct": run["error_pct"], "prediction_source": run["prediction_source"]}
    fit = run.get("calibration_fit")
    if fit:
        entry["time_error_pct_after_calibration"] = fit["error_pct_after"]
    summary["runs"].append(entry)
    f = lambda b: "n/a" if b is None else f"{b / 2**20:.1f} MiB"
    p = lambda x: "n/a" if x is None else f"{x:+.1f}%"
    rows.append(f"| {name} | {f(meas)} ({r['memory_measure']}) | {f(pred)} | {p(mem_err)} | {f(entry['tracked_bytes'])} | "
                f"{run['iteration_ms_measured']:.2f} | {run['iteration_ms_predicted'] or float('nan'):.2f} | {p(run['error_pct'])} |")
md = ["# GPU check", "", summary["env"], "",
      "| run | peak measured | peak predicted | memory error | tracked (hooks) | step ms | predicted ms | time error |",
      "|---|---|---|---|---|---|---|---|", *rows, "",
      "memory error = 100 x (predicted - measured) / measured; measured = the allocator's peak over one step "
      "(torch.cuda.max_memory_allocated on CUDA; torch's CPU allocator on a dry run), as the memory measure column says.", ""]
(out / "summary.md").write_text("\n".join(md))
(out / "summary.json").write_text(json.dumps(summary, indent=2))
print("\n".join(md))
EOF
echo "gpu-check: done; see $OUT/summary.md" >&2
