"""A data x pipeline x tensor search result as a plan file (the `parallel` object of plan JSON),
as a summary for machines, and as a table for people.

The plan holds one pipeline replica: `pp` devices (each standing for a tensor-parallel group
of `tp` GPUs, with the searched memory per GPU as its limit), the chosen cuts, schedule,
micro-batches per replica and recompute, with `parallel` = {dp, pp, tp, zero, gpus_per_node,
hardware, grad_sync}; its global batch is dp x micro-batch size x micro-batches. `predicted`
carries what the 3D search simulated (iteration time, tokens/s, TFLOP/s per GPU, MFU, and per
device its peak memory against the limit); `search` the runners-up, each with its layout, and the
layouts left out. `pplan simulate` prices the plan again on the same hardware
(planner.simulation.replica) and draws its timeline with the collectives on it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from planner.errors import PplanError
from planner.hardware import Hardware
from planner.partition.parallel_search import ParallelCandidate, ParallelResult
from planner.plan import Plan, Prediction, SearchRecord, SearchRow, StagePlan
from planner.profiling.profile import Profile
from planner.simulation.replica import Cluster, replica_layout
from planner.units import format_bytes

__all__ = ["parallel_plan", "parallel_summary", "format_parallel"]

_OBJECTIVE = ("per dp x pp x tp layout, micro-batch size, schedule and recompute: min over cuts of the busiest rank's "
              "time per micro-batch (pipeline DP on one GPU's costs) under the memory per GPU; the estimates within "
              "a margin of the best few simulated, ranked by simulated iteration time")


def parallel_plan(result: ParallelResult, profile: Profile, hardware: Hardware,
                  candidate: ParallelCandidate | None = None) -> Plan:
    """The plan of `candidate` (default: the best) of `result`, searched on `profile` and `hardware`;
    its devices' limit is the memory per GPU the search held the plans to."""
    if result.vocab_parallel:  # `pplan run` keeps the embedding and head whole: such a plan would not run as priced
        raise PplanError("this search priced Megatron's vocabulary-parallel embedding and head, which pplan run does not execute",
                         "search again with vocab_parallel=False to write a plan")
    c = candidate or result.best
    # the hardware's values too: `pplan simulate` prices the plan on them, not on a preset that shares the name
    cfg = replace(c.config, gpus_per_node=result.gpus_per_node, hardware=hardware.name, hardware_spec=hardware,
                  grad_sync=result.grad_sync)
    cluster = Cluster(hardware, result.gpus_per_node, overlap_grad_sync=cfg.overlaps_grad_sync)
    devices, links = replica_layout(cfg, result.memory_bytes, cluster)
    stages = []
    for s in range(len(c.cuts) - 1):
        first, end = c.cuts[s], c.cuts[s + 1]
        recompute = tuple(range(first, end)) if c.recompute == "full" else ()
        stages.append(StagePlan(device=s % cfg.pp, layers=(first, end), recompute=recompute))
    predicted = Prediction(
        iteration_ms=c.iteration_ms, bubble_fraction=c.bubble_fraction, throughput_samples_per_s=c.samples_per_s,
        schedule=c.schedule, n_microbatches=c.n_microbatches, micro_batch_size=c.micro_batch_size,
        devices=c.devices or None, tokens_per_s=c.tokens_per_s, tflops_per_gpu=c.tflops_per_gpu, mfu=c.mfu,
        grad_sync_ms=c.grad_sync_ms, tp_comm_ms=c.tp_comm_ms, hardware=hardware.name,
    )
    return Plan(
        schedule=c.schedule, micro_batch_size=c.micro_batch_size, n_microbatches=c.n_microbatches,
        stages=tuple(stages), devices=devices, optimizer="adam", links=links,
        model=profile.meta.get("model"), n_layers=profile.n_layers, profile_path=profile.path,
        profile_sha256=profile.sha256, predicted=predicted, parallel=cfg, search=_search_record(result, c),
    )


def _search_record(result: ParallelResult, chosen: ParallelCandidate) -> SearchRecord:
    """How the layout was chosen: the runners-up (each row's note names its layout and recompute,
    which a one-pipeline row has no field for) and the layouts left out, with why."""
    rows = tuple(SearchRow(
        method="dp", schedule=c.schedule, n_microbatches=c.n_microbatches, micro_batch_size=c.micro_batch_size,
        fits=c.fits, iteration_ms=c.iteration_ms, bubble_fraction=c.bubble_fraction,
        peak_memory_bytes=int(c.peak_memory_bytes), slowdown_vs_plan=c.iteration_ms / chosen.iteration_ms,
        cuts=c.cuts, note=_layout_note(c),
    ) for c in result.candidates if c is not chosen)
    return SearchRecord(method="dp", source="dp", objective=_OBJECTIVE, recompute=chosen.recompute,
                        schedule=chosen.schedule, n_microbatches=chosen.n_microbatches,
                        micro_batch_size=chosen.micro_batch_size, calibrated=False, candidates=rows,
                        skipped=result.skipped)


def _layout_note(c: ParallelCandidate) -> str:
    """'dp=4,pp=4,tp=1 recompute none' (and why it does not fit, when it does not)."""
    note = f"{c.config.describe()} {c.schedule_label} recompute {c.recompute}"
    return note if c.fits else f"{note}; over the memory per GPU"


def parallel_summary(result: ParallelResult) -> dict[str, Any]:
    """What `pplan partition --nodes --json` prints beside the plan: the cluster, what the prices
    assumed, and every simulated candidate (the table's rows) with per-GPU peak memory and fit."""
    return {
        "gpus": result.gpus, "gpus_per_node": result.gpus_per_node, "hardware": result.hardware,
        "global_batch": result.global_batch, "seq": result.seq, "dtype": result.dtype, "flops_source": result.flops_source,
        "mfu_peak_flops_per_s": result.mfu_peak_flops_per_s, "memory_per_gpu_bytes": int(result.memory_bytes),
        "grad_sync": result.grad_sync, "held_to": result.held_to or None,
        "layouts": result.layouts, "pipeline_dps": result.solved, "skipped": list(result.skipped),
        "warnings": list(result.warnings),
        "candidates": [{
            "parallel": c.config.to_dict(), "schedule": c.schedule, "chunks": (len(c.cuts) - 1) // c.config.pp,
            "micro_batch_size": c.micro_batch_size, "n_microbatches": c.n_microbatches, "recompute": c.recompute,
            "iteration_ms": c.iteration_ms, "samples_per_s": c.samples_per_s, "tokens_per_s": c.tokens_per_s,
            "tflops_per_gpu": c.tflops_per_gpu, "mfu": c.mfu, "bubble_fraction": c.bubble_fraction,
            "grad_sync_ms": c.grad_sync_ms, "tp_comm_ms": c.tp_comm_ms, "peak_memory_bytes": int(c.peak_memory_bytes),
            "memory": c.memory.as_dict(), "fits": c.fits, "cuts": list(c.cuts),
        } for c in result.candidates],
    }


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def format_parallel(result: ParallelResult, n_rows: int = 6) -> str:
    """A table of the best plans for people (the CLI prints it)."""
    head = (f"{result.gpus} x {result.hardware} ({_count(result.gpus // result.gpus_per_node, 'node')} x {result.gpus_per_node}), "
            f"global batch {result.global_batch}, seq {result.seq}; {_count(result.layouts, 'layout')}, "
            f"{_count(result.solved, 'point')} priced; "
            f"FLOPs: {result.flops_source}; {result.dtype}, MFU against {result.mfu_peak_flops_per_s / 1e12:.4g} TFLOP/s peak"
            + f"; gradient sync {result.grad_sync}" + (f"; held to {result.held_to}" if result.held_to else ""))
    cols = ("dp", "pp", "tp", "zero", "sched", "b", "M", "recomp", "iter ms", "samples/s", "tokens/s", "TFLOP/s/GPU", "MFU", "peak mem", "fits")
    rows = []
    for c in result.candidates[:n_rows]:
        rows.append((str(c.config.dp), str(c.config.pp), str(c.config.tp), str(c.config.zero), c.schedule_label, str(c.micro_batch_size),
                     str(c.n_microbatches), c.recompute, f"{c.iteration_ms:,.1f}", f"{c.samples_per_s:,.2f}", f"{c.tokens_per_s:,.0f}",
                     f"{c.tflops_per_gpu:.1f}", f"{100 * c.mfu:.1f}%", format_bytes(c.peak_memory_bytes), "yes" if c.fits else "no"))
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(cols)]
    lines = [head, "  ".join(h.rjust(w) for h, w in zip(cols, widths))]
    lines += ["  ".join(x.rjust(w) for x, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)
