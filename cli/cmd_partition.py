"""`pplan partition`: choose stage cuts, micro-batch count, recompute and schedule under memory limits.

Thin: declare options, check the outputs can be written, make one library call
(planner.partition.job: partition_pipeline, or partition_cluster with --nodes/--hardware), write
the plan atomically (and the figure), print the report or JSON. Everything, the layout figure's
sweep included, is computed before the plan file is written, so an error leaves no file.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from cli.common import (
    at_least, check_calibration_input, check_hardware_input, check_input_file, echo_json, err, profile_inputs, step_progress,
)
from cli.options import CalibrationOption
from planner.limits import DEFAULT_BANDWIDTH, DEFAULT_LATENCY_MS, OPTIMIZER_MEANINGS
from planner.units import format_rate

if TYPE_CHECKING:
    from planner.partition.job import ClusterJob, PipelineJob

__all__ = ["register"]

# Written from the one list of optimizers and the one default link, so the help cannot drift from them.
_OPTIMIZER_HELP = ", ".join(f"{name} ({meaning})" for name, meaning in OPTIMIZER_MEANINGS.items())
_DEFAULT_BANDWIDTH_TEXT, _DEFAULT_LATENCY_TEXT = format_rate(DEFAULT_BANDWIDTH), f"{DEFAULT_LATENCY_MS:g}ms"


def register(app: typer.Typer) -> None:
    app.command("partition")(partition_cmd)


def partition_cmd(
    profile_path: Annotated[Path, typer.Argument(metavar="PROFILE.csv", help="Profile CSV (from `pplan profile` or profiles/).")],
    devices: Annotated[Optional[int], typer.Option("--devices", "-n", help="Pipeline devices; required without --cluster. With --cluster every device of its file is used: leave it out, or give that count (any other is refused).")] = None,
    memory: Annotated[Optional[str], typer.Option("--memory", help="Memory per device, e.g. 16GiB or 500MB; a plain number is bytes (default: unlimited; with --nodes, the hardware's GPU memory; with --cluster, for the devices its file gives none).")] = None,
    global_batch: Annotated[int, typer.Option("--global-batch", help="Samples per iteration (= micro-batches x micro-batch size).")] = ...,
    microbatches: Annotated[Optional[str], typer.Option("--microbatches", help="auto (every divisor of the batch; the default) or a count M. With --nodes: M per data-parallel replica, each layout then running micro-batches of batch / (dp x M) samples.")] = None,
    schedule: Annotated[Optional[str], typer.Option("--schedule", help="auto (the default), gpipe, 1f1b, interleaved or zb. With --nodes, the layouts are searched with that schedule only.")] = None,
    recompute: Annotated[str, typer.Option("--recompute", help="auto (per layer, only where memory needs it), none or all.")] = "auto",
    optimizer: Annotated[Optional[str], typer.Option("--optimizer", help=f"Optimizer whose state memory is planned for: {_OPTIMIZER_HELP}; default adam.")] = None,
    bandwidth: Annotated[Optional[str], typer.Option("--bandwidth", help=f"Link bandwidth between devices, e.g. 25GB/s or 100Gbit/s (bits); a plain number is bytes/s (default {_DEFAULT_BANDWIDTH_TEXT}; a calibration's measured link replaces the default, any other value wins over the calibration; with --cluster, for pairs of devices its file gives no link, if it has no default_link).")] = None,
    latency: Annotated[Optional[str], typer.Option("--latency", help=f"Link latency per message, e.g. 0.01ms or 5us; a plain number is ms (default {_DEFAULT_LATENCY_TEXT}; a calibration's measured latency replaces the default, any other value wins over the calibration; with --cluster, for pairs of devices its file gives no link, if it has no default_link).")] = None,
    cluster: Annotated[Optional[Path], typer.Option("--cluster", help="Cluster JSON: devices (memory, speed) and links (see examples/cluster.json).")] = None,
    method: Annotated[Optional[str], typer.Option("--method", help="auto (the default), dp, ilp, uniform, params or time.")] = None,
    time_limit: Annotated[Optional[float], typer.Option("--time-limit", help="With --method ilp: seconds the ILP may use over the whole search (default 60; positive and finite).")] = None,
    nodes: Annotated[Optional[int], typer.Option("--nodes", help="GPU nodes: plan data x pipeline x tensor parallelism over nodes x --gpus-per-node GPUs of --hardware.")] = None,
    gpus_per_node: Annotated[Optional[int], typer.Option("--gpus-per-node", help="GPUs per node (default: the hardware preset's, 8 for the GPU presets).")] = None,
    hardware: Annotated[Optional[str], typer.Option("--hardware", help="Hardware preset (see `pplan hardware`) or a hardware JSON file; needed with --nodes.")] = None,
    parallel: Annotated[Optional[str], typer.Option("--parallel", help="With --nodes: auto (search every dp x pp x tp; the default) or a layout such as dp=8,pp=12,tp=4.")] = None,
    zero: Annotated[Optional[int], typer.Option("--zero", help="With --nodes: ZeRO stage 0-3 (default 0) of the data-parallel group, as pplan run executes it: 1 shards the optimizer state; 2 the same (gradients stay whole at a pipeline's peak) and holds the gathered stage beside its shards; 3 also shards the weights, gathering one layer at a time.")] = None,
    grad_sync: Annotated[Optional[str], typer.Option("--grad-sync", help="With --nodes: how the data-parallel gradient sync is priced: after-step (the default; pplan run all-reduces the gradients after the schedule's step, none of it hidden) or overlapped (hidden behind each stage's last backward, as bucketed DeepSpeed and torch DDP run it; Megatron-LM 2021 did not overlap; the plan records which).")] = None,
    calibration: CalibrationOption = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the plan JSON.")] = Path("plan.json"),
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Also draw a PNG: the layers, skip tensors and the plan's cuts; with --nodes, TFLOP/s per GPU of every dp x pp x tp layout.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan and a summary as JSON instead of tables.")] = False,
) -> None:
    """Search stage cuts x micro-batches x recompute x schedule; write the fastest plan that fits.

    Every candidate is simulated; the plan records the prediction, the runners-up and the
    baselines (uniform, parameter- and time-balanced cuts). Exit code 2 with the least memory
    or the fewest devices that would work when nothing fits.
    """
    from planner.partition.job import partition_cluster, partition_pipeline
    from planner.partition.options import cluster_settings_from_options, settings_from_options

    cluster_mode = nodes is not None or hardware is not None
    _check_mode_flags(cluster_mode, {
        "--devices": devices, "--optimizer": optimizer, "--bandwidth": bandwidth, "--latency": latency,
        "--cluster": cluster, "--method": method, "--time-limit": time_limit, "--calibration": calibration,
    }, {"--gpus-per-node": gpus_per_node, "--parallel": parallel, "--zero": zero, "--grad-sync": grad_sync})
    _check_inputs(profile_path, cluster, calibration, hardware, global_batch)
    _check_outputs(out, plot, profile_path, cluster, calibration, hardware)
    if cluster_mode:
        cluster_settings = cluster_settings_from_options(nodes=nodes, hardware=hardware, global_batch=global_batch,
                                                         gpus_per_node=gpus_per_node, parallel=parallel or "auto",
                                                         zero=zero, recompute=recompute, memory=memory,
                                                         schedule=schedule or "auto", microbatches=microbatches or "auto",
                                                         grad_sync=grad_sync or "after-step")
        with step_progress("partition", terminal_only=True) as on_step:  # logs and pipes stay quiet
            job = partition_cluster(profile_path, cluster_settings, layouts=plot is not None, on_step=on_step)
        _finish_cluster(job, out, plot, as_json)
        return
    settings = settings_from_options(devices=devices, memory=memory, global_batch=global_batch,
                                     microbatches=microbatches or "auto", schedule=schedule or "auto",
                                     recompute=recompute, optimizer=optimizer or "adam",
                                     bandwidth=bandwidth, latency=latency, cluster=cluster,
                                     method=method or "auto", time_limit=time_limit)
    with step_progress("partition", terminal_only=True) as on_step:  # logs and pipes stay quiet
        job = partition_pipeline(profile_path, settings, calibration=calibration, on_step=on_step)
    _finish_pipeline(job, out, plot, as_json)


def _check_mode_flags(cluster_mode: bool, pipeline_only: dict[str, object], cluster_only: dict[str, object]) -> None:
    """Refuse a flag the chosen search never reads (None: not given; the defaults are None so
    that a given value can be told from the default). --nodes/--hardware search data x pipeline
    x tensor layouts on the hardware's GPUs and links, with Adam, the pipeline DP (no ILP, so no
    time limit) and no calibration; one pipeline has no data or tensor parallelism to lay out.
    --schedule and --microbatches hold either search."""
    from planner.errors import PplanError

    dropped = pipeline_only if cluster_mode else cluster_only
    given = [f"{flag} {value if isinstance(value, (int, float)) else repr(str(value))}"
             for flag, value in dropped.items() if value is not None]
    if not given:
        return
    if cluster_mode:
        raise PplanError(f"{', '.join(given)}: not used with --nodes/--hardware (the data x pipeline x tensor search "
                         "takes its GPUs and links from --nodes and --hardware, prices Adam, cuts each pipeline "
                         "with the DP and runs uncalibrated)",
                         "drop it, or drop --nodes/--hardware to plan one pipeline")
    raise PplanError(f"{', '.join(given)}: only used with --nodes and --hardware (data x pipeline x tensor parallelism)",
                     "drop it, or add e.g. --nodes 2 --hardware a100-80gb")


def _check_inputs(profile: Path, cluster: Optional[Path], calibration: Optional[str], hardware: Optional[str],
                  global_batch: int) -> None:
    """Refuse, with what to give instead, a folder where a file is read, and a batch of no samples."""
    from planner.errors import ClusterError, ProfileError

    at_least("--global-batch", global_batch, 1,
             "give the samples per iteration (micro-batches x micro-batch size), e.g. --global-batch 64")
    check_input_file(profile, "profile", "profile", error=ProfileError)
    check_input_file(cluster, "cluster file", "cluster", error=ClusterError)
    check_calibration_input(calibration)
    check_hardware_input(hardware)


def _check_outputs(out: Path, plot: Optional[Path], profile: Path, cluster: Optional[Path], calibration: Optional[str],
                   hardware: Optional[str]) -> None:
    """Refuse outputs that cannot be written before the search: a plan that cannot be saved is not searched for."""
    from planner.atomic import ensure_outputs_distinct, ensure_writable_file
    from planner.errors import PplanError

    if out.suffix.lower() != ".json":
        raise PplanError(f"--out {str(out)!r} must end in .json", "the plan is written as JSON, e.g. --out plan.json")
    if out.exists() and out.is_dir():
        raise PplanError(f"--out {str(out)!r} is a directory", "give a file name such as plan.json")
    ensure_writable_file(out, "--out")
    if plot is not None:
        if plot.suffix.lower() != ".png":
            raise PplanError(f"--plot {str(plot)!r} must end in .png", "it is drawn as PNG, e.g. --plot layers.png")
        ensure_writable_file(plot, "--plot")
    ensure_outputs_distinct([("--out", out), ("--plot", plot)],
                            [*profile_inputs(profile, calibration, hardware), ("cluster file", cluster)])


def _finish_pipeline(job: PipelineJob, out: Path, plot: Optional[Path], as_json: bool) -> None:
    """Write the plan (and the layer figure), then print the report or JSON."""
    from planner.partition import summary_dict, summary_text
    from planner.plan import plan_to_dict, write_plan

    write_plan(job.plan, out)
    for line in job.warnings:
        err(f"pplan: warning: {line}")
    if plot is not None:
        from planner.report.fig_graph import plan_graph

        plan_graph(job.plan, job.profile, plot)
        err(f"wrote {plot}")
    if as_json:
        echo_json({"plan": plan_to_dict(job.plan), "summary": summary_dict(job.result), "out": str(out),
                   "basis": job.basis,
                   "calibration": None if job.calibration_path is None else str(job.calibration_path)})
        return
    typer.echo(f"basis: {job.basis}")
    typer.echo(summary_text(job.result))
    typer.echo("")
    typer.echo(f"wrote {out}  (simulate it: pplan simulate {out})")


def _finish_cluster(job: ClusterJob, out: Path, plot: Optional[Path], as_json: bool) -> None:
    """`--nodes/--hardware`: write the plan of one replica (and the layout figure), then print the layouts or JSON."""
    from planner.partition.parallel_plan import format_parallel, parallel_summary
    from planner.plan import plan_to_dict, write_plan

    write_plan(job.plan, out)
    for line in job.warnings:  # e.g. a profile made for other hardware, zero-bubble memory without wgrad_bytes
        err(f"pplan: warning: {line}")
    if plot is not None:
        from planner.report.fig_parallel import write_layout_figure

        write_layout_figure(job.layouts, job.result.best, job.layouts_title, plot)
        err(f"wrote {plot}")
    if as_json:
        echo_json({"plan": plan_to_dict(job.plan), "summary": parallel_summary(job.result), "out": str(out),
                   "basis": job.basis, "calibration": None})
        return
    typer.echo(format_parallel(job.result))
    typer.echo("")
    typer.echo(f"wrote {out}  (plan of one pipeline replica with parallel {job.plan.parallel.describe()})")
