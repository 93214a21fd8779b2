"""The data x pipeline x tensor parallel layout of a plan: `ParallelConfig(dp, pp, tp, zero)`.

N GPUs = dp (data-parallel replicas) x pp (pipeline stages) x tp (tensor-parallel ranks).
Placement (Narayanan et al., SC21): tp innermost, within one node; pipeline neighbours next
(on the fastest links left); dp outermost. `zero` is the ZeRO stage (Rajbhandari et al., 2020)
of the data-parallel group: 0 none, 1 optimizer state, 2 the same as pplan runs it under a pipeline
(gradients stay whole at its peak: docs/parallel.md), 3 + weights sharded.

A plan JSON holds it as the object `"parallel": {"dp": D, "pp": P, "tp": T, "zero": Z}`
(`to_dict` / `from_dict`), with the cluster it was planned for when known (`"gpus_per_node"`,
`"hardware"`: a preset name or a hardware file's name, and `"hardware_spec"`: that hardware's values
with the keys of a hardware file) so `pplan simulate` can price it again without the file, whose
name may be a preset's (`pplan hardware h100-80gb --json > my.json`, edited, keeps `h100-80gb`);
`parse_parallel("dp=8,pp=12,tp=4")` reads the command-line form.

`grad_sync` records what the plan's prediction assumed of the data-parallel gradient sync:
"after-step" (all of it after the last backward, as `pplan run` executes it) or "overlapped"
(hidden behind each stage's last backward, as Megatron-LM's later versions, DeepSpeed and DDP
do). A plan without the key was written before it existed, when predictions assumed overlap.

`run_error(cfg)` (`run_refusal(cfg)`: its one line) is the rule of which layouts `pplan run`
cannot execute whatever the model; planner.partition.parallel_runnable adds the model's rule
(which models tensor parallelism splits), and the search and the executor both ask it there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

from planner.errors import PplanError
from planner.jsonio import nearest

if TYPE_CHECKING:  # planner.hardware sits a layer above: a plan's hardware_spec is read by planner.plan.serialize
    from planner.hardware import Hardware

__all__ = ["ParallelConfig", "ZERO_STAGES", "GRAD_SYNC_MODES", "GRAD_SYNC_AFTER_STEP", "GRAD_SYNC_OVERLAPPED",
           "checked_grad_sync", "parse_parallel", "run_error", "run_refusal", "zero_tp_error"]

ZERO_STAGES = (0, 1, 2, 3)
GRAD_SYNC_AFTER_STEP = "after-step"
"""The gradient sync runs after the last backward, none of it hidden (what `pplan run` does)."""
GRAD_SYNC_OVERLAPPED = "overlapped"
"""The gradient sync overlaps each stage's last backward (Megatron-LM's later versions, DeepSpeed, DDP)."""
GRAD_SYNC_MODES = (GRAD_SYNC_AFTER_STEP, GRAD_SYNC_OVERLAPPED)
_MAX_DEGREE = 1 << 20
_KEYS = ("dp", "pp", "tp", "zero")
_CLUSTER_KEYS = ("gpus_per_node", "hardware", "grad_sync")
_SPEC_KEY = "hardware_spec"
_MAX_NAME = 200


@dataclass(frozen=True)
class ParallelConfig:
    """Degrees of data, pipeline and tensor parallelism, and the ZeRO stage."""

    dp: int = 1
    """Data-parallel replicas (D)."""
    pp: int = 1
    """Pipeline stages, one GPU group each (P)."""
    tp: int = 1
    """Tensor-parallel ranks per stage, within one node (T)."""
    zero: int = 0
    """ZeRO stage of the data-parallel group (0..3)."""
    gpus_per_node: int | None = field(default=None, compare=False)
    """GPUs per node of the cluster it was planned for (None: the hardware's); not part of the layout's identity."""
    hardware: str | None = field(default=None, compare=False)
    """Hardware preset or file name it was planned for (None: unknown); not part of the layout's identity."""
    grad_sync: str | None = field(default=None, compare=False)
    """What the prediction assumed of the gradient sync (GRAD_SYNC_MODES; None: not recorded, a plan
    written before the key existed, whose numbers assumed "overlapped"); not part of the layout's identity."""
    hardware_spec: Hardware | None = field(default=None, compare=False)
    """The values of the hardware `hardware` names, as planned on (None: a plan written before the key
    existed, priced on the preset of that name); not part of the layout's identity."""

    def __post_init__(self) -> None:
        for key in ("dp", "pp", "tp"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _MAX_DEGREE:
                raise PplanError(f"parallel {key} must be a whole number in 1..{_MAX_DEGREE}, got {value!r}", "e.g. dp=8,pp=12,tp=4")
        if isinstance(self.zero, bool) or self.zero not in ZERO_STAGES:
            raise PplanError(f"ZeRO stage must be one of 0, 1, 2, 3, got {self.zero!r}",
                             "0 shards nothing, 1 the optimizer state, 2 the same (gradients stay whole at a pipeline's peak) "
                             "and holds the gathered stage beside its shards, 3 also the weights: e.g. --zero 1")
        gpn = self.gpus_per_node
        if gpn is not None and (isinstance(gpn, bool) or not isinstance(gpn, int) or not 1 <= gpn <= _MAX_DEGREE):
            raise PplanError(f"parallel gpus_per_node must be a whole number in 1..{_MAX_DEGREE}, got {gpn!r}", "e.g. 8")
        if gpn is not None and gpn % self.tp:
            raise PplanError(f"parallel tp={self.tp} does not divide gpus_per_node {gpn}",
                             "tensor parallelism stays within a node: tp must divide the GPUs per node")
        if self.hardware is not None and (not isinstance(self.hardware, str) or not 0 < len(self.hardware) <= _MAX_NAME):
            raise PplanError(f"parallel hardware must be a name of 1..{_MAX_NAME} characters, got {str(self.hardware)[:40]!r}",
                             "a preset (`pplan hardware`) or a hardware file's name")
        if self.grad_sync is not None:
            checked_grad_sync(self.grad_sync, "parallel grad_sync")
        spec = self.hardware_spec
        if spec is not None and self.hardware is not None and spec.name != self.hardware:
            raise PplanError(f"parallel hardware {self.hardware[:60]!r} but its hardware_spec is named {spec.name[:60]!r}",
                             "give both the same name, or re-plan with `pplan partition --nodes N --hardware NAME`")

    @property
    def overlaps_grad_sync(self) -> bool:
        """Whether the prediction hides the gradient sync behind the last backward (an unrecorded
        choice is an older plan's, which did)."""
        return self.grad_sync != GRAD_SYNC_AFTER_STEP

    @property
    def gpus(self) -> int:
        """dp x pp x tp."""
        return self.dp * self.pp * self.tp

    def to_dict(self) -> dict[str, Any]:
        """The plan JSON object (the cluster keys only when known; hardware_spec as a hardware file holds it)."""
        out: dict[str, Any] = {"dp": self.dp, "pp": self.pp, "tp": self.tp, "zero": self.zero}
        for key in _CLUSTER_KEYS:
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.hardware_spec is not None:
            out[_SPEC_KEY] = self.hardware_spec.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], read_hardware: Callable[[Any], Hardware] | None = None) -> "ParallelConfig":
        """Read the plan JSON object; PplanError names an unknown key or a bad value. `read_hardware`
        validates a hardware_spec as a hardware file (planner.hardware.hardware_from_dict: this
        module sits below it); without it a hardware_spec is refused."""
        if not isinstance(data, Mapping):
            raise PplanError("a plan's parallel entry must be an object like {\"dp\": 8, \"pp\": 12, \"tp\": 4, \"zero\": 1}")
        known = _KEYS + _CLUSTER_KEYS + (_SPEC_KEY,)
        unknown = sorted(map(str, set(data) - set(known)))
        if unknown:
            close = nearest(unknown[0], known)
            raise PplanError(f"unknown key {unknown[0][:40]!r} in parallel" + (f" (did you mean {close!r}?)" if close else ""),
                             f"known keys: {', '.join(known)}")
        values = {k: data[k] for k in known if k in data}
        if _SPEC_KEY in values:
            if read_hardware is None:
                raise TypeError("ParallelConfig.from_dict needs read_hardware to read a hardware_spec (planner.plan.serialize passes it)")
            values[_SPEC_KEY] = read_hardware(values[_SPEC_KEY])
        return cls(**values)

    def describe(self) -> str:
        """`dp=8,pp=12,tp=4` (and `,zero=1` when sharded)."""
        text = f"dp={self.dp},pp={self.pp},tp={self.tp}"
        return text + (f",zero={self.zero}" if self.zero else "")


def checked_grad_sync(mode: str, what: str = "--grad-sync") -> str:
    """`mode` when it is one of GRAD_SYNC_MODES; else PplanError naming the nearest one."""
    if mode in GRAD_SYNC_MODES:
        return mode
    guess = nearest(str(mode), GRAD_SYNC_MODES)
    raise PplanError(f"{what} must be one of {', '.join(GRAD_SYNC_MODES)}, got {str(mode)[:40]!r}",
                     (f"did you mean {guess!r}? " if guess else "") + f"{GRAD_SYNC_AFTER_STEP} is what pplan run executes")


def parse_parallel(text: str, zero: int | None = None) -> ParallelConfig:
    """`dp=D,pp=P,tp=T` (any order, missing degrees 1; `zero=Z` allowed) -> ParallelConfig. The
    text's zero wins; `zero` (the separate --zero, None when not given) fills it in when the text
    has none, and is refused when it says another stage."""
    values: dict[str, int] = {}
    for item in str(text).split(","):
        if not item.strip():
            continue
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq or key not in _KEYS:
            raise PplanError(f"cannot read {item.strip()[:40]!r} in --parallel {str(text)[:60]!r}", "write auto or dp=D,pp=P,tp=T")
        if key in values:  # which one was meant is a guess either way: the last one used to win silently
            raise PplanError(f"--parallel {str(text)[:60]!r} gives {key} twice ({key}={values[key]} and {key}={raw.strip()[:20]})",
                             "give each of dp, pp, tp, zero once, e.g. dp=2,pp=4,tp=8")
        try:
            values[key] = int(raw.strip())
        except ValueError:
            raise PplanError(f"--parallel {key}={raw.strip()[:20]!r} is not a whole number") from None
    if "zero" in values and zero is not None and values["zero"] != zero:
        raise PplanError(f"--parallel {str(text)[:60]!r} says zero={values['zero']} but --zero is {zero}",
                         "give the ZeRO stage once: in --parallel or with --zero")
    values.setdefault("zero", 0 if zero is None else zero)
    return ParallelConfig(**values)


def run_error(cfg: ParallelConfig) -> PplanError | None:
    """Why `pplan run` cannot execute layout `cfg` whatever the model (an error naming the rule,
    with what would run), or None when it can. ZeRO-2/3 over dp > 1 replicas with tp > 1: the tp
    blocks' DTensor parameters would be sharded again over dp (2-D fully_shard under torch's
    pipeline stages), which the executor does not wire (planner/execute/tensor.py); ZeRO-1 runs
    with tp."""
    return zero_tp_error(cfg.zero, cfg.tp) if cfg.dp > 1 else None


def run_refusal(cfg: ParallelConfig) -> str | None:
    """run_error as one line, or None."""
    error = run_error(cfg)
    return None if error is None else error.one_line()


def zero_tp_error(zero: int, tp: int) -> PplanError | None:
    """run_refusal's rule for a data-parallel layout, ZeRO stage `zero` beside tp-way tensor parallelism,
    as an error with its hint (what the executor's preflight raises); None where it runs."""
    if tp > 1 and zero >= 2:
        return PplanError(f"ZeRO stage {zero} with tensor parallelism (tp {tp}) is not supported by pplan run: sharding "
                          "the tp blocks' DTensor parameters again over dp is not wired",
                          "zero 0 or 1 runs with tp > 1, zero 2 or 3 with tp=1")
    return None
