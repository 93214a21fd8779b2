"""`pplan partition`: choose stage cuts, micro-batch count, recompute and schedule under memory limits.

Thin: parse flags, call planner.partition.partition, print the report (or JSON), write the plan
atomically. Everything is computed before the plan file is written, so an error leaves no file.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from cli.common import echo_json, err, progress
from cli.options import CalibrationOption

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    app.command("partition")(partition_cmd)


def partition_cmd(
    profile_path: Annotated[Path, typer.Argument(metavar="PROFILE.csv", help="Profile CSV (from `pplan profile` or profiles/).")],
    devices: Annotated[Optional[int], typer.Option("--devices", "-n", help="Pipeline devices (default with --cluster: all of its devices).")] = None,
    memory: Annotated[Optional[str], typer.Option("--memory", help="Memory per device, e.g. 16GiB or 500MB (default: unlimited).")] = None,
    global_batch: Annotated[int, typer.Option("--global-batch", help="Samples per iteration (= micro-batches x micro-batch size).")] = ...,
    microbatches: Annotated[str, typer.Option("--microbatches", help="auto (every divisor of the batch) or a count M.")] = "auto",
    schedule: Annotated[str, typer.Option("--schedule", help="auto, gpipe, 1f1b, interleaved or zb.")] = "auto",
    recompute: Annotated[str, typer.Option("--recompute", help="auto (per layer, only where memory needs it), none or all.")] = "auto",
    optimizer: Annotated[str, typer.Option("--optimizer", help="adam, adamw, sgd (momentum) or sgd-plain: sets optimizer memory.")] = "adam",
    bandwidth: Annotated[str, typer.Option("--bandwidth", help="Link bandwidth between devices, e.g. 25GB/s.")] = "25GB/s",
    latency: Annotated[str, typer.Option("--latency", help="Link latency per message, e.g. 0.01ms or 5us.")] = "0.01ms",
    cluster: Annotated[Optional[Path], typer.Option("--cluster", help="Cluster JSON: devices (memory, speed) and links (see examples/cluster.json).")] = None,
    method: Annotated[str, typer.Option("--method", help="auto, dp, ilp, uniform, params or time.")] = "auto",
    time_limit: Annotated[float, typer.Option("--time-limit", help="Seconds the ILP may use over the whole search.")] = 60.0,
    nodes: Annotated[Optional[int], typer.Option("--nodes", help="GPU nodes: plan data x pipeline x tensor parallelism over nodes x --gpus-per-node GPUs of --hardware.")] = None,
    gpus_per_node: Annotated[Optional[int], typer.Option("--gpus-per-node", help="GPUs per node (default: the hardware preset's, 8 for the GPU presets).")] = None,
    hardware: Annotated[Optional[str], typer.Option("--hardware", help="Hardware preset (see `pplan hardware`) or a hardware JSON file; needed with --nodes.")] = None,
    parallel: Annotated[str, typer.Option("--parallel", help="With --nodes: auto (search every dp x pp x tp) or a layout such as dp=8,pp=12,tp=4.")] = "auto",
    zero: Annotated[int, typer.Option("--zero", help="With --nodes: ZeRO stage 0-3 of the data-parallel group (1 shards optimizer state, 2 also gradients, 3 also weights).")] = 0,
    calibration: CalibrationOption = None,
    out: Annotated[Path, typer.Option("--out", help="Where to write the plan JSON.")] = Path("plan.json"),
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Also draw a PNG: the layers, skip tensors and the plan's cuts; with --nodes, TFLOP/s per GPU of every dp x pp x tp layout.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan and a summary as JSON instead of tables.")] = False,
) -> None:
    """Search stage cuts x micro-batches x recompute x schedule; write the fastest plan that fits.

    Every candidate is simulated; the plan records the prediction, the runners-up and the
    baselines (uniform, parameter- and time-balanced cuts). Exit code 2 with the least memory
    or the fewest devices that would work when nothing fits.
    """
    from planner.calibration import basis_text
    from planner.machine import prediction_basis
    from planner.partition import partition, summary_dict, summary_text
    from planner.partition.api import resolve_devices, validate_settings
    from planner.partition.options import settings_from_options
    from planner.partition.search import grid_points
    from planner.plan import plan_to_dict, write_plan
    from planner.profiling.profile import load_profile

    _check_outputs(out, plot)
    if nodes is not None or hardware is not None:
        _partition_cluster(profile_path, nodes=nodes, gpus_per_node=gpus_per_node, hardware=hardware, parallel=parallel,
                           zero=zero, global_batch=global_batch, recompute=recompute, memory=memory, out=out, as_json=as_json,
                           plot=plot)
        return
    settings = settings_from_options(devices=devices, memory=memory, global_batch=global_batch,
                                     microbatches=microbatches, schedule=schedule, recompute=recompute,
                                     optimizer=optimizer, bandwidth=bandwidth, latency=latency, cluster=cluster,
                                     method=method, time_limit=time_limit)
    prof = load_profile(profile_path)
    validate_settings(prof, settings)
    cal, cal_path = prediction_basis(prof, calibration, ranks=settings.n_devices)
    if sys.stderr.isatty():  # a bar for people; logs and pipes stay quiet
        n_points = len(grid_points(settings, len(resolve_devices(settings)[0]), prof.n_layers)[0])
        with progress(n_points, "partition") as bar:
            result = partition(prof, settings, calibration=cal, on_step=bar.advance)
    else:
        result = partition(prof, settings, calibration=cal)
    write_plan(result.plan, out)
    if plot is not None:
        from planner.report.fig_graph import plan_graph

        plan_graph(result.plan, prof, plot)
        err(f"wrote {plot}")
    if as_json:
        echo_json({"plan": plan_to_dict(result.plan), "summary": summary_dict(result), "out": str(out),
                   "basis": basis_text(cal, cal_path), "calibration": None if cal_path is None else str(cal_path)})
        return
    typer.echo(f"basis: {basis_text(cal, cal_path)}")
    typer.echo(summary_text(result))
    typer.echo("")
    typer.echo(f"wrote {out}  (simulate it: pplan simulate {out})")


def _check_outputs(out: Path, plot: Optional[Path]) -> None:
    """Refuse outputs that cannot be written before the search: a plan that cannot be saved is not searched for."""
    from planner.atomic import ensure_writable_file
    from planner.errors import PplanError

    if out.suffix.lower() != ".json":
        raise PplanError(f"--out {str(out)!r} must end in .json")
    if out.exists() and out.is_dir():
        raise PplanError(f"--out {str(out)!r} is a directory", "give a file name such as plan.json")
    ensure_writable_file(out, "--out")
    if plot is not None:
        if plot.suffix.lower() != ".png":
            raise PplanError(f"--plot {str(plot)!r} must end in .png")
        ensure_writable_file(plot, "--plot")


def _partition_cluster(profile_path: Path, *, nodes: int | None, gpus_per_node: int | None, hardware: str | None,
                       parallel: str, zero: int, global_batch: int, recompute: str, memory: str | None, out: Path,
                       as_json: bool, plot: Path | None = None) -> None:
    """`--nodes/--hardware`: the data x pipeline x tensor search (planner.partition.parallel_search)."""
    from planner.errors import PplanError
    from planner.hardware import load_hardware
    from planner.partition.parallel_plan import parallel_plan
    from planner.partition.options import cluster_recompute
    from planner.partition.parallel_search import format_parallel, plan_parallel
    from planner.plan import plan_to_dict, write_plan
    from planner.profiling.profile import load_profile
    from planner.units import parse_bytes

    if nodes is None or hardware is None:
        raise PplanError("--nodes and --hardware go together", "e.g. --nodes 8 --gpus-per-node 8 --hardware a100-80gb")
    hw = load_hardware(hardware)
    prof = load_profile(profile_path)
    mode = cluster_recompute(recompute)
    result = plan_parallel(prof, hardware=hw, nodes=nodes, gpus_per_node=gpus_per_node, global_batch=global_batch,
                           parallel=parallel.strip().lower(), zero=zero,
                           recompute=mode,
                           memory_bytes=parse_bytes(memory, "--memory") if memory is not None else None)
    plan = parallel_plan(result, prof, hw)
    write_plan(plan, out)
    if plot is not None:
        from planner.partition.parallel_sweep import layout_sweep
        from planner.report.fig_parallel import write_layout_figure

        points = layout_sweep(prof, hardware=hw, nodes=nodes, gpus_per_node=result.gpus_per_node,
                              global_batch=global_batch, zero=zero, recompute=mode,
                              memory_bytes=parse_bytes(memory, "--memory") if memory is not None else None)
        title = (f"{prof.meta.get('model', profile_path)}\n{result.gpus} x {hw.name}, global batch {global_batch}, "
                 f"chosen {result.best.config.describe()}")
        write_layout_figure(points, result.best, title, plot)
        err(f"wrote {plot}")
    if as_json:
        echo_json({"plan": plan_to_dict(plan), "out": str(out)})
        return
    typer.echo(format_parallel(result))
    typer.echo("")
    typer.echo(f"wrote {out}  (plan of one pipeline replica with parallel {plan.parallel.describe()})")
