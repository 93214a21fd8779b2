"""Reading a run JSON (`pplan run --out`) back as its RunRecord, every key and value checked.

The report draws from run files and `pplan calibrate --from-run` fits from them; both may be
handed a file someone else wrote or edited, so both read it here: bounded and code-free
(planner.jsonio), unknown keys refused with the nearest known one at every level, and every
field's value checked against the record's type, each failure one line naming the field.

In this order: first, before any record is built, every count against its range
(runrecord.count_ranges, the ranges check_run_values uses too: `steps` at most --steps' 10,000,000)
and every list and object against the length a run of those counts can have (`check_run_sizes`:
10**15 steps or a million transfer gaps of a two-stage run are refused, not looped over); then
the record, with its types and values (runrecord.check_run_values); then what points elsewhere
in the run and the text it holds (`check_run_indices`: stage layers, loss steps, ping-pong pairs,
host names).
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

from planner.errors import PplanError
from planner.execute.runrecord import (
    COUNT_RANGES, FORMAT, MAX_RUN_RANKS, RUN_FILE_HINT, RunRecord, check_count, count_ranges,
)
from planner.jsonio import read_json_file
from planner.jsontypes import INDEX_KEY, check_index_keys, is_number, json_int, kind_mismatch, objects_in, range_error, short
from planner.limits import MAX_BANDWIDTH, MAX_LATENCY_MS, MAX_MEMORY_BYTES, MAX_MODEL_SPEC_CHARS, MIN_BANDWIDTH, MAX_SIMULATED_ACTIONS
from planner.plan.records import MAX_PIPELINE_STAGES, MAX_PREDICTED_MS
from planner.profiling.csvio import MAX_LAYERS
from planner.textsafe import MAX_TEXT_CHARS, check_name, check_text

__all__ = ["load_run", "parse_run", "ACTION_KEY", "check_run_sizes", "check_run_indices", "MAX_TRANSFER_GAPS",
           "MAX_COMM_POINTS", "MAX_WARNINGS", "MAX_TEXT_CHARS", "MAX_RANK_THREADS"]

ACTION_KEY = re.compile(r"[0-9]{1,9}[FBIWRO]")
"""Keys of objects keyed by stage and action kind ("0F")."""
ACTION_KINDS = 6
"""F, B, I, W, R, O: a rank's action times hold at most this many keys per stage."""
MAX_TRANSFER_GAPS = MAX_SIMULATED_ACTIONS
"""A gap is a forward or backward that waited for its hand-over (at most 2 x n_stages x n_microbatches);
above that, at most the actions one simulation may hold (planner.limits): 17 MB of JSON, whose median
calibrate takes. A 64 MiB file held 3,500,000 gaps and took 11.5 s of CPU and 681 MB to read."""
MAX_COMM_POINTS = 64
"""Message sizes of one ping-pong: planner.execute.commbench measures 4."""
MAX_WARNINGS = 64
"""planner.execute.trust and run write at most 7 warnings, one line each (each at most textsafe's MAX_TEXT_CHARS)."""
MAX_RANK_THREADS = 1 << 16
"""torch threads of one rank: more than any machine's cores (the largest have a few thousand)."""
_LOSS_TEXTS = ("inf", "-inf", "nan", "unknown")


def load_run(path: str | os.PathLike) -> RunRecord:
    """Read a run JSON written by `pplan run` as its typed record (every key and type checked)."""
    data = read_json_file(path, "run", PplanError)
    if not isinstance(data, dict):
        raise PplanError(f"{path}: run must be a JSON object, got {type(data).__name__}", RUN_FILE_HINT)
    return parse_run(data, str(path))


def parse_run(data: dict[str, Any], source: str = "<run>") -> RunRecord:
    """The RunRecord of a run JSON's object; PplanError names the first key or value that is wrong.

    RunRecord.from_dict refuses another format, and at every level (the run, each rank, the
    divergence, the ping-pongs, the calibration and its fit) an unknown key, a missing field and a
    value of the wrong type (planner.jsontypes.record_fields), the memory breakdowns included. The
    sizes are checked before it (check_run_sizes), the keys of objects keyed by data here too, and
    the indices and texts after it (check_run_indices). So a hand-edited or hostile file fails on
    one line, never inside a figure or a fit.
    """
    if not isinstance(data, dict):
        raise PplanError(f"{source}: run must be a JSON object, got {short(data)}", RUN_FILE_HINT)
    try:
        check_run_sizes(data)
    except PplanError as e:
        raise PplanError(f"{source}: {e.message}", e.hint or RUN_FILE_HINT) from None
    _check_nested(data, source)
    # the record allows null, but every reader compares a prediction with it (absent: a missing field)
    if "iteration_ms_measured" in data and not is_number(measured := data["iteration_ms_measured"]):
        raise PplanError(f"{source}: run field 'iteration_ms_measured' must be a number, got {short(measured)}",
                         "give the JSON of a run that timed at least one step")
    try:
        run = RunRecord.from_dict(data)
        check_run_indices(run)
    except PplanError as e:
        raise PplanError(f"{source}: {e.message}", e.hint or RUN_FILE_HINT) from None
    return run


def _check_nested(data: dict[str, Any], source: str) -> None:
    """Refuse a key of an object keyed by data that is not an action or a stage."""
    for i, rank in enumerate(objects_in(data, "ranks")):
        for key in ("action_ms", "action_cpu_ms"):
            check_index_keys(rank.get(key), ACTION_KEY, "stage and action kind such as '0F'", f"{source}: ranks[{i}].{key}")
    check_index_keys(data.get("boundary_bytes"), INDEX_KEY, "stage indices", f"{source}: boundary_bytes")


# ---- before the record is built: counts and lengths ------------------------------------------------


def _increasing(where: str, values: list[int]) -> None:
    """Refuse a list of steps that repeats one or goes back (each step is timed and logged once)."""
    for i in range(1, len(values)):
        if values[i] <= values[i - 1]:
            raise PplanError(f"{where} item {i} is {values[i]} after {values[i - 1]}: not in increasing order, "
                             "each step at most once", RUN_FILE_HINT)


def _length(where: str, value: Any, high: int, what: str, why: str) -> None:
    """Refuse a list or object `value` with more than `high` items (anything else: its type is refused later)."""
    if isinstance(value, (list, dict)) and len(value) > high:
        raise PplanError(f"{where} holds {len(value)} {what}, not 0..{high} ({why})", RUN_FILE_HINT)


def check_run_sizes(data: dict[str, Any]) -> None:
    """Refuse, before any record is built or any list walked, a count out of its range and a list or
    object longer than a run of those counts writes. Values of the wrong type are left to the
    record's reader, which names their type; a file of another format to RunRecord.from_dict."""
    if kind_mismatch(data, "run") is not None or data.get("format", FORMAT) != FORMAT:
        return
    steps = json_int(data.get("steps"))
    steps = COUNT_RANGES["steps"][1] if steps is None else steps  # checked first, before the counts inside it
    # step_ms is not read yet (a wrong item is the record reader's to name): it holds at most a time per step
    ranges = count_ranges(steps, n_step_times=steps)
    counts = {name: value for name in ranges if (value := json_int(data.get(name))) is not None}
    ranks = data.get("ranks")
    _length("run field 'ranks'", ranks, MAX_RUN_RANKS, "rank records", "one per process")
    if isinstance(ranks, list) and counts.get("n_ranks", len(ranks)) != len(ranks):
        raise PplanError(f"run field 'n_ranks' is {short(counts['n_ranks'])}, not the {len(ranks)} rank record(s) "
                         "the run holds", RUN_FILE_HINT)
    for name, (low, high) in ranges.items():
        if name in counts:
            check_count(f"run field {name!r}", counts[name], low, high)
    _check_step_lists(data, steps, steps - counts.get("first_step", 0))
    n_stages = counts.get("n_stages", MAX_PIPELINE_STAGES)
    _check_stage_lists(data, n_stages, counts.get("n_microbatches", COUNT_RANGES["n_microbatches"][1]),
                       exact="n_stages" in counts)
    _length("run field 'comm'", data.get("comm"), max(0, counts.get("n_ranks", MAX_RUN_RANKS) - 1), "ping-pongs",
            "one per pair of neighbouring ranks")
    for i, comm in enumerate(objects_in(data, "comm")):
        _length(f"comm[{i}] field 'points'", comm.get("points"), MAX_COMM_POINTS, "points", "one per message size")
    _length("run field 'warnings'", data.get("warnings"), MAX_WARNINGS, "warnings", "pplan writes a few")
    for i, rank in enumerate(objects_in(data, "ranks")):
        _length(f"ranks[{i}] field 'stages'", rank.get("stages"), n_stages, "stages", "at most the run's n_stages")
        for key in ("action_ms", "action_cpu_ms"):
            _length(f"ranks[{i}] field {key!r}", rank.get(key), ACTION_KINDS * n_stages, "action times",
                    f"{ACTION_KINDS} kinds per stage of the run")


def _check_step_lists(data: dict[str, Any], steps: int, steps_run: int) -> None:
    """The lists of a run that hold an item per step: at most one per step the run reached or ran."""
    _length("run field 'step_ms'", data.get("step_ms"), max(0, steps_run), "step times",
            "one per step from first_step to steps")
    for name in ("losses", "loss_steps"):
        _length(f"run field {name!r}", data.get(name), steps, "items", "at most one per step")
    _length("run field 'measured_steps'", data.get("measured_steps"), max(0, steps_run), "indices",
            "at most one per step from first_step to steps")
    for name in ("loss_steps", "measured_steps"):  # before the summary of the steps is compared with them
        if isinstance(values := data.get(name), list) and all(json_int(v) is not None for v in values):
            _increasing(f"run field {name!r}", values)


def _check_stage_lists(data: dict[str, Any], n_stages: int, n_microbatches: int, exact: bool) -> None:
    """The lists of a run that hold an item per stage, or per stage and micro-batch. `exact`: the
    run gives n_stages (without it, `n_stages` is only the bound, and the record's reader names the
    missing field)."""
    gaps = min(MAX_TRANSFER_GAPS, 2 * n_stages * n_microbatches)
    _length("run field 'transfer_gaps'", data.get("transfer_gaps"), gaps, "gaps",
            f"one per forward and backward hand-over: 2 x n_stages x n_microbatches, at most {MAX_TRANSFER_GAPS:,}")
    _length("run field 'boundary_bytes'", data.get("boundary_bytes"), n_stages, "stages", "one per stage of the run")
    for name in ("stage_layers", "stage_recompute"):
        value = data.get(name)
        if not exact:
            _length(f"run field {name!r}", value, n_stages, "stages", "one per stage of the run")
        elif isinstance(value, list) and len(value) != n_stages:
            raise PplanError(f"run field {name!r} holds {len(value)} stages, not the run's n_stages ({n_stages})",
                             RUN_FILE_HINT)
    recompute = data.get("stage_recompute")
    for i, layers in enumerate(recompute if isinstance(recompute, list) else ()):
        _length(f"run field 'stage_recompute' item {i}", layers, MAX_LAYERS, "layers", "a model's layers at most")
    fit = data.get("calibration_fit")
    if isinstance(fit, dict):  # the fit takes a point per F, B and I+W of each stage of each rank
        slots = sum(len(r["stages"]) for r in objects_in(data, "ranks") if isinstance(r.get("stages"), list))
        _length("calibration_fit field 'compute_points'", fit.get("compute_points"), 3 * slots, "points",
                "one per forward, backward and I+W of each stage of each rank")


# ---- after the record is built: what points elsewhere, and the text -------------------------------

def _number(where: str, value: Any, low: float, high: float) -> None:
    """Refuse a number (None passes: the field may be null) that is not finite or lies outside low..high."""
    if value is not None and (message := range_error(value, low, high, where)) is not None:
        raise PplanError(message, RUN_FILE_HINT)


def _text(where: str, value: str | None, limit: int = MAX_TEXT_CHARS) -> None:
    """Text a report prints: bounded, and free of control characters that would rewrite a terminal."""
    if value is not None:
        check_text(value, "text", PplanError, where, limit, hint=RUN_FILE_HINT)


def check_run_indices(run: RunRecord) -> None:
    """Refuse, in a record read from a file (its counts already bounded), an index that points outside
    the run, a step or stage listed twice, a number that no run measures and a text that is no name."""
    check_name(run.runtime, "runtime", PplanError, "run field 'runtime'")
    for name in ("plan", "model", "prediction_source"):
        _text(f"run field {name!r}", getattr(run, name), MAX_MODEL_SPEC_CHARS)  # the model spec, or a path
    for i, line in enumerate(run.warnings):
        _text(f"run field 'warnings' item {i}", line)
    for i, step in enumerate(run.loss_steps):  # 0-based; older files count from 1 (tests/data/report/run.json)
        check_count(f"run field 'loss_steps' item {i}", step, 0, run.steps)
    if run.diverged is not None:
        check_count("diverged field 'step'", run.diverged.step, 0, run.steps)
        _check_loss_text(run.diverged.loss)
    for stage in run.boundary_bytes:
        if stage != str(int(stage)):  # "07" and "7" would be one stage twice
            raise PplanError(f"run field 'boundary_bytes' key {stage!r} is not a stage index as pplan writes it "
                             f"({int(stage)})", RUN_FILE_HINT)
    for name in ("error_pct", "step_spread_pct"):
        _number(f"run field {name!r}", getattr(run, name), -math.inf if name == "error_pct" else 0.0, math.inf)
    for name in ("load_average", "profile_load_average", "compute_ratio", "compute_ratio_cpu"):
        _number(f"run field {name!r}", getattr(run, name), 0.0, math.inf)
    _check_stage_layers(run)
    _check_rank_indices(run)
    _check_comm(run)
    _check_fit(run)


def _check_loss_text(loss: str) -> None:
    """A divergence's loss as results writes it: inf, -inf, nan, unknown, or a number's text."""
    try:
        number = loss in _LOSS_TEXTS or (len(loss) <= 40 and math.isfinite(float(loss)))
    except ValueError:
        number = False
    if not number:
        raise PplanError(f"diverged field 'loss' is {short(loss)}, not a loss ({', '.join(_LOSS_TEXTS)} or a number)",
                         RUN_FILE_HINT)


def _check_stage_layers(run: RunRecord) -> None:
    """Each stage's [first, end) layers: contiguous from layer 0, within a model's MAX_LAYERS; each
    stage's recomputed layers inside the stage, each once."""
    ranges = run.stage_layers
    for i, pair in enumerate(ranges or ()):
        start = 0 if i == 0 else ranges[i - 1][1]
        if len(pair) != 2 or pair[0] != start or not start < pair[1] <= MAX_LAYERS:
            raise PplanError(f"run field 'stage_layers' item {i} is {short(pair)}, not a [first, end) layer range "
                             f"with first {start} (where the stage before ends) and end in {start + 1}..{MAX_LAYERS}",
                             RUN_FILE_HINT)
    for i, layers in enumerate(run.stage_recompute or ()):
        first, end = ranges[i] if ranges is not None else (0, MAX_LAYERS)
        for layer in layers:
            check_count(f"run field 'stage_recompute' item {i} layer", layer, first, end - 1)
        if len(set(layers)) != len(layers):
            raise PplanError(f"run field 'stage_recompute' item {i} is {short(layers)}: a layer listed twice",
                             RUN_FILE_HINT)


def _check_rank_indices(run: RunRecord) -> None:
    """Each rank's host, threads, stages (each once) and the stages its action times name."""
    for i, rank in enumerate(run.ranks):
        where = f"ranks[{i}] field"
        check_name(rank.host, "host name", PplanError, f"{where} 'host'")
        if rank.threads is not None:
            check_count(f"{where} 'threads'", rank.threads, 1, MAX_RANK_THREADS)
        if len(set(rank.stages)) != len(rank.stages):
            raise PplanError(f"{where} 'stages' is {short(rank.stages)}: a stage listed twice", RUN_FILE_HINT)
        for name in ("action_ms", "action_cpu_ms"):
            for key in getattr(rank, name):
                check_count(f"{where} {name!r} key {key!r} stage", int(key[:-1]), 0, run.n_stages - 1)


def _check_comm(run: RunRecord) -> None:
    """Each ping-pong: neighbouring ranks (a, a + 1) of the run, times, bandwidth, [bytes, ms] points."""
    for i, c in enumerate(run.comm):
        check_count(f"comm[{i}] field 'a'", c.a, 0, run.n_ranks - 2)
        check_count(f"comm[{i}] field 'b'", c.b, c.a + 1, c.a + 1)
        _number(f"comm[{i}] field 'latency_ms'", c.latency_ms, 0.0, MAX_LATENCY_MS)
        _number(f"comm[{i}] field 'bandwidth_bytes_per_s'", c.bandwidth_bytes_per_s, MIN_BANDWIDTH, MAX_BANDWIDTH)
        for j, point in enumerate(c.points):
            if len(point) != 2:
                raise PplanError(f"comm[{i}] field 'points' item {j} is {short(point)}, not a [bytes, ms] pair",
                                 RUN_FILE_HINT)
            _number(f"comm[{i}] field 'points' item {j} bytes", point[0], 0, MAX_MEMORY_BYTES)
            _number(f"comm[{i}] field 'points' item {j} ms", point[1], 0.0, MAX_LATENCY_MS)


def _check_fit(run: RunRecord) -> None:
    """What --calibrate fitted: times a prediction can state, errors finite, its points' actions the run's."""
    fit = run.calibration_fit
    if fit is None:
        return
    for name in ("measured_ms", "predicted_ms_before", "predicted_ms_after"):
        _number(f"calibration_fit field {name!r}", getattr(fit, name), 0.0, MAX_PREDICTED_MS)
    for name in ("error_pct_before", "error_pct_after"):
        _number(f"calibration_fit field {name!r}", getattr(fit, name), -math.inf, math.inf)
    _text("calibration_fit field 'path'", fit.path)
    for i, point in enumerate(fit.compute_points):
        where = f"calibration_fit.compute_points[{i}] field"
        match = _FIT_ACTION.fullmatch(point.action)
        if match is None:
            raise PplanError(f"{where} 'action' is {short(point.action)}, not a stage and action kind such as '0F' "
                             "or '2I+W'", RUN_FILE_HINT)
        check_count(f"{where} 'action' stage", int(match.group(1)), 0, run.n_stages - 1)
        _number(f"{where} 'profiled_ms'", point.profiled_ms, 0.0, MAX_PREDICTED_MS)
        _number(f"{where} 'measured_ms'", point.measured_ms, 0.0, MAX_PREDICTED_MS)


_FIT_ACTION = re.compile(r"([0-9]{1,9})(F|B|I|W|I\+W)")
"""A compute point's action: a stage and a kind, or '2I+W' for a split backward's halves together."""
