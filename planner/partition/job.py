"""`pplan partition` as library calls: a profile file and typed settings in, every record out.

`partition_pipeline` is the single-pipeline search (stage cuts x micro-batches x recompute x
schedule, priced with the calibration that applies); `partition_cluster` is the data x
pipeline x tensor search over GPU nodes. Both compute everything the command prints or
draws and write nothing: the caller decides the outputs, so an error part-way leaves no file.
Neither imports typer or matplotlib (the figures are drawn by planner.report from these
records).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from planner.calibration import Calibration, basis_text, calibration_mismatch, links_described, links_given_win
from planner.hardware import Hardware
from planner.parallel import GRAD_SYNC_AFTER_STEP, GRAD_SYNC_OVERLAPPED, checked_grad_sync
from planner.machine import prediction_basis
from planner.partition.api import PartitionResult, partition, resolve_devices, validate_settings
from planner.partition.parallel_plan import parallel_plan
from planner.partition.parallel_search import ParallelResult, plan_parallel
from planner.partition.parallel_sweep import LayoutPoint, layout_sweep
from planner.partition.search import PartitionSettings, grid_points, polish_steps
from planner.plan import Plan
from planner.profiling.profile import Profile, load_profile
from planner.simulate import unpriced_memory_note

__all__ = ["ClusterSettings", "PipelineJob", "ClusterJob", "StepCallback", "partition_pipeline", "partition_cluster"]

StepCallback = Callable[[int, int, str], None]
"""on_step(done, total, note): once with done=0 when the search starts (so a progress bar can
start its clock with the right size), then once as each of the `total` grid points and polish slots begins."""


@dataclass(frozen=True)
class ClusterSettings:
    """What the data x pipeline x tensor search is asked (`pplan partition --nodes`); plan_parallel checks the values."""

    nodes: int
    """GPU nodes."""
    hardware: Hardware
    """The GPU (and its node's links) every node has."""
    global_batch: int
    """Samples per iteration over all data-parallel replicas."""
    gpus_per_node: int | None = None
    """GPUs per node; None: the hardware preset's."""
    parallel: str = "auto"
    """'auto' (search every dp x pp x tp) or a forced layout such as 'dp=8,pp=12,tp=4'."""
    zero: int | None = None
    """ZeRO stage 0-3 of the data-parallel group; None: the one `parallel` names, else 0."""
    recompute: str = "auto"
    """none, full or auto (both are tried)."""
    memory_bytes: int | None = None
    """Memory per GPU; None: the hardware's."""
    schedule: str = "auto"
    """'auto' (every schedule) or the one registry schedule the search is held to."""
    microbatches: int | None = None
    """Micro-batches per data-parallel replica the search is held to; None: every count its sizes give."""
    grad_sync: str = GRAD_SYNC_AFTER_STEP
    """How the gradient sync is priced (planner.parallel.GRAD_SYNC_MODES): after the step, as `pplan
    run` executes it, or overlapped with the last backward, as Megatron, DeepSpeed and DDP do."""

    def __post_init__(self) -> None:
        checked_grad_sync(self.grad_sync)


@dataclass(frozen=True)
class PipelineJob:
    """A single-pipeline search and the basis its predictions were made on."""

    result: PartitionResult
    """The search: the chosen plan, its candidates and baselines (summary_text / summary_dict read it)."""
    calibration: Calibration | None
    """The calibration the search priced with; None: profile times as measured."""
    calibration_path: Path | None
    """The file that calibration came from (None when there is none)."""
    warnings: tuple[str, ...] = ()
    """One line each for the command to print: a calibration fitted on another model or profile,
    what the profile cannot price for the plan (zero-bubble memory without wgrad_bytes)."""

    @property
    def plan(self) -> Plan:
        """The plan to write."""
        return self.result.plan

    @property
    def profile(self) -> Profile:
        """The profile planned for (the layer figure draws its layers)."""
        return self.result.profile

    @property
    def basis(self) -> str:
        """One phrase naming the basis of the prediction: uncalibrated, or calibrated by which file."""
        return basis_text(self.calibration, self.calibration_path)


@dataclass(frozen=True)
class ClusterJob:
    """A data x pipeline x tensor search, its plan of one pipeline replica, and the layout sweep when asked."""

    result: ParallelResult
    """The search: best layout first, its runners-up (format_parallel prints them)."""
    plan: Plan
    """The best candidate as a plan of one pipeline replica, with `parallel` filled."""
    profile: Profile
    """The profile planned for."""
    layouts: tuple[LayoutPoint, ...]
    """Every dp x pp x tp layout's best throughput, for the layout figure; empty unless asked."""
    layouts_title: str
    """The layout figure's title: the model, the GPUs, the global batch and the chosen layout."""
    warnings: tuple[str, ...] = ()
    """One line each for the command to print: the search's own (e.g. a profile made for other
    hardware), then what the profile cannot price for the plan (zero-bubble memory without wgrad_bytes)."""

    @property
    def basis(self) -> str:
        """The basis of the prediction: the data x pipeline x tensor search runs uncalibrated."""
        return basis_text(None)


def partition_pipeline(profile_path: str | os.PathLike, settings: PartitionSettings,
                       calibration: str | os.PathLike | None = None,
                       on_step: StepCallback | None = None) -> PipelineJob:
    """Load and check the profile, find the calibration that applies (`calibration`: a file,
    'none', or None for the profile's own or this machine's) and search; InfeasibleError (with
    the fix) when nothing fits. The checks run in the order a user fixes them: the settings
    against the profile, then the calibration file, then the search."""
    profile = load_profile(profile_path)
    validate_settings(profile, settings)
    devices, links = resolve_devices(settings)
    # the machine file's entry for as many processes as the plan has devices (a cluster file's too,
    # where settings.n_devices is None): the one `pplan simulate` and `pplan run` will price it with
    found, cal_path = prediction_basis(profile, calibration, ranks=len(devices))
    cal = links_given_win(found, *links_described(links))  # as partition() prices it
    counted = _counted(on_step, _steps(profile, settings)) if on_step is not None else None  # the count costs a grid
    result = partition(profile, settings, calibration=cal, on_step=counted)
    plan = result.plan
    notes = (calibration_mismatch(cal, profile, cal_path), _link_note(found, cal, settings),
             # the why-table lists every candidate's schedule, so each counts
             unpriced_memory_note(plan, profile, {c.point.schedule for c in result.search.candidates}))
    return PipelineJob(result=result, calibration=cal, calibration_path=cal_path,
                       warnings=tuple(n for n in notes if n))


def _link_note(found: Calibration | None, used: Calibration | None, settings: PartitionSettings) -> str | None:
    """One line when the links the user gave replaced a calibration's measured ones (None otherwise)."""
    if found is None or used is None or found == used:
        return None
    bandwidth, latency = links_described(resolve_devices(settings)[1])
    given = "the cluster file" if settings.cluster is not None else " and ".join(
        flag for flag, on in (("--bandwidth", bandwidth), ("--latency", latency)) if on)
    measured = ", ".join(text for text in (
        f"{found.comm_bandwidth_bytes_per_s / 1e9:.3g} GB/s" if used.comm_bandwidth_bytes_per_s is None and found.comm_bandwidth_bytes_per_s else "",
        f"{found.comm_latency_ms:.3g} ms per message" if used.comm_latency_ms is None and found.comm_latency_ms is not None else "") if text)
    return f"the links come from {given}, not from the calibration's measured link ({measured}); its compute terms still apply"


def partition_cluster(profile_path: str | os.PathLike, settings: ClusterSettings, *, layouts: bool = False,
                      on_step: StepCallback | None = None) -> ClusterJob:
    """Search `settings` on the profile and make the plan; with `layouts`, also price every
    layout for the figure (one search per layout: as long again as the search or longer).
    `on_step`: the search's progress (plan_parallel's)."""
    profile = load_profile(profile_path)
    common = dict(hardware=settings.hardware, nodes=settings.nodes, global_batch=settings.global_batch,
                  zero=settings.zero, recompute=settings.recompute, memory_bytes=settings.memory_bytes,
                  schedules=None if settings.schedule == "auto" else (settings.schedule,), microbatches=settings.microbatches,
                  overlap_grad_sync=settings.grad_sync == GRAD_SYNC_OVERLAPPED)
    result = plan_parallel(profile, gpus_per_node=settings.gpus_per_node, parallel=settings.parallel, on_step=on_step, **common)
    plan = parallel_plan(result, profile, settings.hardware)
    # the sweep prices every layout with the ZeRO stage the search used (--zero, or --parallel's zero=)
    points = layout_sweep(profile, gpus_per_node=result.gpus_per_node, **{**common, "zero": result.best.config.zero}) if layouts else ()
    title = (f"{profile.meta.get('model', profile_path)}\n{result.gpus} x {settings.hardware.name}, "
             f"global batch {settings.global_batch}, chosen {result.best.config.describe()}")
    wgrad = unpriced_memory_note(plan, profile)
    return ClusterJob(result=result, plan=plan, profile=profile, layouts=points, layouts_title=title,
                      warnings=tuple(result.warnings) + ((wgrad,) if wgrad else ()))


def _steps(profile: Profile, settings: PartitionSettings) -> int:
    """How many grid points partition() visits: the number of on_step calls it makes."""
    return len(grid_points(settings, len(resolve_devices(settings)[0]), profile.n_layers)[0]) + polish_steps(settings)


def _counted(on_step: StepCallback, total: int) -> Callable[[str], None]:
    """partition()'s on_step(note) as on_step(done, total, note), announced with done=0 first."""
    on_step(0, total, "")
    done = 0

    def step(note: str) -> None:
        nonlocal done
        done += 1
        on_step(done, total, note)

    return step
