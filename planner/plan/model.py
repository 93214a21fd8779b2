"""The plan's types: devices, stages, links and the Plan itself, valid by construction."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from planner.limits import DEFAULT_BANDWIDTH, DEFAULT_LATENCY_MS
from planner.parallel import ParallelConfig
from planner.plan.checks import validate_plan
from planner.plan.digest import plan_digest
from planner.plan.records import Prediction, SearchRecord
from planner.schedules import PipelineSchedule, generate

__all__ = ["DEFAULT_BANDWIDTH", "DEFAULT_LATENCY_MS", "Device", "StagePlan", "Links", "Plan"]

# DEFAULT_BANDWIDTH and DEFAULT_LATENCY_MS are planner.limits' (re-exported here for planner.plan's users)


@dataclass(frozen=True)
class Device:
    """One accelerator of the pipeline."""

    name: str
    """A label (cluster device name, or cpu0, cuda1 ...)."""
    memory_bytes: int | None = None
    """Memory limit in bytes; None = unlimited."""
    speed: float = 1.0
    """Relative compute speed: profile times are divided by it."""


@dataclass(frozen=True)
class StagePlan:
    """A contiguous range of layers on one device."""

    device: int
    """Index into Plan.devices."""
    layers: tuple[int, int]
    """[first, end) layer indices."""
    recompute: tuple[int, ...] = ()
    """Layers checkpointed (activations recomputed in backward)."""


@dataclass(frozen=True)
class Links:
    """Point-to-point links: a default, and overrides per device pair (undirected)."""

    bandwidth_bytes_per_s: float = DEFAULT_BANDWIDTH
    """Default bandwidth, bytes per second."""
    latency_ms: float = DEFAULT_LATENCY_MS
    """Default latency per message, ms."""
    pairs: tuple[tuple[int, int, float, float], ...] = ()
    """(device a, device b, bandwidth bytes/s, latency ms) overrides."""

    def between(self, a: int, b: int) -> tuple[float, float]:
        """(bandwidth bytes/s, latency ms) of the link from device a to device b."""
        return self._by_pair.get((min(a, b), max(a, b)), (self.bandwidth_bytes_per_s, self.latency_ms))

    @cached_property
    def _by_pair(self) -> dict[tuple[int, int], tuple[float, float]]:
        """The overrides by (lower, higher) device, the first one listed where a pair is given twice: a
        scan of `pairs` per call made ordering a 128-device cluster 5 s (n^2 calls x the pairs)."""
        index: dict[tuple[int, int], tuple[float, float]] = {}
        for x, y, bw, lat in self.pairs:
            index.setdefault((min(x, y), max(x, y)), (bw, lat))
        return index


@dataclass(frozen=True)
class Plan:
    """A complete pipeline plan (JSON form: planner.plan). Construction validates it: PlanError
    names what is inconsistent (stages that do not tile the layers, an unknown schedule, ...)."""

    schedule: str
    """gpipe, 1f1b, interleaved or zb."""
    micro_batch_size: int
    """Samples per micro-batch."""
    n_microbatches: int
    """Micro-batches per iteration (global batch = size x count)."""
    stages: tuple[StagePlan, ...]
    """Stages in model order."""
    devices: tuple[Device, ...]
    """Devices; stage.device indexes this."""
    optimizer: str = "adam"
    """adam, adamw, sgd (momentum) or sgd-plain."""
    links: Links = field(default_factory=Links)
    """Link model between devices."""
    model: str | None = None
    """Model spec the profile was made from (needed by `pplan run`)."""
    seed: int = 0
    """Seed the model weights are built from."""
    n_layers: int | None = None
    """Layer count of the model (checked against profile and model)."""
    profile_path: str | None = None
    """Profile the plan was made from."""
    profile_sha256: str | None = None
    """Checksum of that profile."""
    predicted: Prediction | None = None
    """The simulator's prediction (iteration_ms, bubble_fraction, per-device memory ...). One given
    without `made_for` is stamped with this plan's digest on construction (planner.plan.digest)."""
    search: SearchRecord | None = None
    """How the partitioner chose (method, runners-up, baselines): informational."""
    parallel: ParallelConfig | None = None
    """Data/tensor parallelism around the pipeline (None: one pipeline, dp = tp = 1)."""

    def __post_init__(self) -> None:
        validate_plan(self)
        if self.predicted is not None and self.predicted.made_for is None:
            # The prediction joins this plan here: record which plan it is of, so that a later edit
            # (by hand in the file, or with_ in memory) is seen when the plan is read again.
            object.__setattr__(self, "predicted", replace(self.predicted, made_for=plan_digest(self)))

    @property
    def dp(self) -> int:
        """Data-parallel replicas of the pipeline (1 without a `parallel` object)."""
        return self.parallel.dp if self.parallel is not None else 1

    @property
    def tp(self) -> int:
        """Tensor-parallel ranks per pipeline device (1 without a `parallel` object)."""
        return self.parallel.tp if self.parallel is not None else 1

    @property
    def n_processes(self) -> int:
        """Processes a run of the plan needs: dp x pipeline devices x tp."""
        return self.dp * self.n_devices * self.tp

    @property
    def global_batch(self) -> int:
        """Samples per iteration: every data-parallel replica runs n_microbatches x micro_batch_size."""
        return self.dp * self.micro_batch_size * self.n_microbatches

    @property
    def n_devices(self) -> int:
        """Pipeline devices (one data-parallel replica's)."""
        return len(self.devices)

    @property
    def n_stages(self) -> int:
        """Pipeline stages, in model order."""
        return len(self.stages)

    @property
    def cuts(self) -> list[int]:
        """Stage boundaries in layer order: each stage's first layer, then the last stage's end."""
        return [st.layers[0] for st in self.stages] + [self.stages[-1].layers[1]]

    @property
    def virtual_stages(self) -> int:
        """Stages per device (1 except for interleaved schedules)."""
        return len(self.stages) // len(self.devices)

    def pipeline_schedule(self) -> PipelineSchedule:
        """The schedule this plan runs, validated: what the simulator simulates and the executor runs
        (ScheduleError when these sizes cannot run)."""
        return generate(self.schedule, self.n_devices, self.n_microbatches, self.virtual_stages)

    def with_(self, **changes: Any) -> "Plan":
        """A copy with fields replaced (for what-if overrides); validated like any plan."""
        return replace(self, **changes)

    def validate(self, n_layers: int | None = None) -> None:
        """Raise PlanError unless the stages cover exactly `n_layers` layers (the rest holds by construction)."""
        validate_plan(self, n_layers)
