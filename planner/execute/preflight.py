"""Checks before any process starts: the plan matches its model and profile, the devices exist.

Refused with a one-line PlanError/PplanError (exit code 2):
  - a plan without a model spec, or whose stages do not cover exactly the model's layers;
  - a model too large to build on this machine (planner.models.bounds; every kind), or
    --input-shape / --input-dtype / --vocab given for a model kind that does not read them, or
    differing from what the plan's profile records (model_kwargs);
  - a profile measured in float16 (run_dtype: a run trains in the profile's dtype, without loss
    scaling); a bfloat16 profile's model and float inputs are cast to bfloat16 (model_kwargs);
  - a plan whose profile file exists but changed since the plan was made (sha256 differs),
    records another model (`# model:`, compared parsed: check_profile_model) or has another
    layer count;
  - more ranks than this machine can run: CUDA, more than its GPUs; CPU, more than
    max(8, 4 x cores) processes (beyond that a run measures contention, not the plan) unless
    --force; zero-bubble or interleaved sizes torch cannot run;
  - a checkpoint directory already at or beyond --steps, or saved by another plan;
  - after the prediction (run.py calls check_host_memory): CPU ranks predicted to need more than
    this machine's usable memory together, unless --force;
  - a `parallel` layout the executor cannot run (check_parallel): tensor parallelism (tp > 1)
    of a model other than the built-in gpt or with a tp that does not divide its heads and FFN
    width, ZeRO-2/3 with tp > 1, a pp degree other than the plan's device count, --calibrate
    with dp > 1 or tp > 1. ZeRO 1-3 run (planner.execute.zero), tensor parallelism of the gpt
    too (planner.execute.tensor); with dp = 1 there is nothing to shard and zero runs as 0.
"""

from __future__ import annotations

import glob
import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.errors import ModelSpecError, ModelTooLargeError, PlanError, PplanError, ProfileError
from planner.execute.options import RunOptions
from planner.jsonio import read_bounded_bytes
from planner.partition.parallel_runnable import layout_error
from planner.hostinfo import usable_cores
from planner.plan import Plan, Prediction, resolve_profile_path
from planner.profiling.metadata import MAX_CO_RUN
from planner.profiling.profile import MAX_PROFILE_BYTES, Profile, load_profile, profile_from_bytes
from planner.units import format_bytes

__all__ = ["Preflight", "preflight", "check_parallel", "check_profile_unchanged", "check_profile_model", "check_host_memory",
           "same_model", "model_kwargs", "run_dtype", "cpu_rank_cap", "no_gpu_device_nodes", "co_run_advice"]


@dataclass(frozen=True)
class Preflight:
    """What the checks found out, for the launcher."""

    n_layers: int
    """Layers of the model."""
    profile: Profile | None
    """The plan's profile when it is on disk (for the prediction and calibration)."""
    device_type: str
    """cpu or cuda."""
    model_kwargs: dict[str, Any]
    """Extra build_model arguments recorded in the profile (input shape of a factory model)."""
    resume_step: int
    """Steps already done according to the checkpoint directory (0 when starting fresh)."""
    warnings: tuple[str, ...] = ()
    """Why the run's comparison may mislead, known before it starts (the run record's warnings)."""


def cpu_rank_cap() -> int:
    """Most CPU ranks `pplan run` starts without --force."""
    return max(8, 4 * usable_cores())


def co_run_advice(want: int, threads: int, cores: int) -> str:
    """What to re-profile with when a CPU run's `want` + 1 ranks on one machine slowed each other
    down (planner.execute.run's co_run_warnings): `pplan profile --co-run K` needs (K + 1) x
    --threads cores and refuses more (planner.profiling.corun.check_co_run), so K is capped by the
    `cores` here; where not even --co-run 1 fits, a calibration on a run is what accounts for it.
    (A 4-rank run on 2 cores advised --co-run 3, which `pplan profile` then refused.)"""
    threads = max(1, threads)
    most = min(want, MAX_CO_RUN, cores // threads - 1)
    if most >= want:
        return f"re-profile with --co-run {want}"
    calibrate = "or calibrate on a run (`pplan calibrate PLAN.json`), which fits the slowdown"
    if most >= 1:
        return (f"re-profile with --co-run {most}, the most this machine's {cores} cores allow at --threads {threads} "
                f"(--co-run {want} needs {(want + 1) * threads}), {calibrate}")
    return (f"a co-running profile needs at least {2 * threads} cores at --threads {threads} and this machine has {cores}: "
            f"profile on a larger one, {calibrate}")


def model_kwargs(profile: Profile | None, opts: RunOptions | None = None) -> dict[str, Any]:
    """build_model's input description and dtype (run_dtype): the profile's record, and the run's --input-shape /
    --input-dtype / --vocab for what it does not record (a hand-written plan, a missing profile).
    A flag that differs from the profile's record is refused: the plan's cuts and predictions are
    for the profiled input (a bert profiled at --input-shape 32 and run at 128 measured 31.4 MiB
    against the 12.6 MiB predicted, with warnings that blamed the machine's load)."""
    out: dict[str, Any] = {}
    meta = profile.meta if profile is not None else {}  # validated when loaded (profile.META_KEYS)
    dtype = run_dtype(profile)
    if dtype != "float32":  # float32 as built: a float32 run's arguments stay what they were
        out["dtype"] = dtype
    if meta.get("input_shape"):
        out["input_shape"] = tuple(int(x) for x in meta["input_shape"].split(",") if x.strip())
        if meta.get("input_dtype"):
            out["input_dtype"] = meta["input_dtype"]
        if meta.get("vocab"):
            out["vocab"] = int(meta["vocab"])
    if opts is not None:
        for key in ("input_shape", "input_dtype", "vocab"):
            given = getattr(opts, key)
            if given is not None and key in out and out[key] != given:
                raise _input_mismatch(key, given, out[key], profile)
            if given is not None:
                out[key] = given
    return out


def run_dtype(profile: Profile | None) -> str:
    """The dtype `pplan run` trains in: the profile's (`# dtype:`; float32 when it records none), as
    `pplan profile --dtype` measured the model and the cost model priced it (a bfloat16 profile run
    in float32 measured weights of 2,207,744 B against 1,103,872 B predicted). float16 is refused:
    pure float16 training needs loss scaling, which pplan run does not do, and Adam's eps (1e-8)
    is 0 in float16, so a parameter whose gradient is 0 (an unused embedding row) gets 0/0."""
    dtype = (profile.meta.get("dtype") if profile is not None else None) or "float32"
    if dtype == "float16":
        where = repr(profile.path) if profile.path else "the plan's profile"
        raise ProfileError(f"profile {where} was measured in float16, which pplan run cannot train in: it trains in the "
                           "profile's dtype without loss scaling (float16 gradients underflow, Adam's eps is 0 in float16)",
                           "re-profile with --dtype bfloat16 (the same 2 bytes, float32's range) or float32, and re-plan")
    return dtype


def _input_mismatch(key: str, given: Any, recorded: Any, profile: Profile | None) -> PlanError:
    """--input-shape/--input-dtype/--vocab that differs from what the plan's profile measured."""
    def shown(v: Any) -> str:
        return ",".join(map(str, v)) if isinstance(v, tuple) else str(v)

    flag = "--" + key.replace("_", "-")
    where = repr(profile.path) if profile is not None and profile.path else "the plan's profile"
    return PlanError(f"{flag} {shown(given)} differs from the {flag} {shown(recorded)} the profile {where} was measured "
                     "with: the plan's cuts and predictions are for that input",
                     f"drop {flag} to run the profiled input; to train on another, profile the model with {flag} "
                     f"{shown(given)} (pplan profile checks that the model takes it) and re-plan")


def check_profile_model(model: str, profile: Profile) -> None:
    """Refuse running `model` against a profile that records another model (`# model:`): the plan's
    cuts, predictions and the memory check would be the other model's (an mlp of width 64 trained
    against its width-2048 profile reported "error +157.5%" and exited 0). The same model written
    otherwise passes: keys in another order, a built-in's defaults spelled out or left out."""
    recorded = (profile.meta.get("model") or "").strip()
    if not recorded or same_model(recorded, model):
        return
    where = repr(profile.path) if profile.path else "the plan's profile"
    raise PlanError(f"plan's model {model.strip()[:200]!r} is not the model {recorded[:200]!r} that its profile {where} "
                    "measured: its cuts and predictions are for that model",
                    "re-profile this model (pplan profile --model ...) and re-partition from that profile, or run the "
                    "profiled model (put its spec back in the plan)")


def same_model(a: str, b: str) -> bool:
    """Whether two model specs name the same model: equal once parsed (keys in any order, a built-in's
    defaults filled in, 2 and 2.0 alike, true never 1), or, when either does not parse, equal as text."""
    from planner.models.spec import parse_spec

    if a.strip() == b.strip():
        return True
    try:
        return _canonical(parse_spec(a)) == _canonical(parse_spec(b))
    except ModelSpecError:
        return False


def _canonical(value: Any) -> Any:
    """`value` with each bool tagged: `==` alone takes True for 1, and a factory may treat them apart."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return tuple(_canonical(v) for v in value)
    return value


def check_host_memory(plan: Plan, prediction: Prediction | None, device_type: str, *, local_world: int | None = None,
                      force: bool = False) -> None:
    """Refuse, before any process starts, a CPU run whose ranks on this machine are predicted to need
    more than its usable memory (planner.models.bounds.usable_memory_bytes) together: they would die
    allocating (a gpipe plan of micro-batches of 10^7, 6.1 TiB a device, started 4 ranks that failed
    with `DefaultCPUAllocator: can't allocate memory`). `local_world`: the ranks torchrun starts on
    this machine (None: every rank runs here); which of them is not known here, so the smallest
    `local_world` ranks' peaks are summed, a floor. Not checked: --force, a CUDA run (its peaks are on
    the GPUs), a prediction without per-device peaks, and a data/tensor-parallel plan whose
    prediction is not priced for its layout (one replica of whole layers: no tp split, no ZeRO shards)."""
    from planner.models.bounds import usable_memory_bytes
    from planner.simulate import is_replica_plan

    if force or device_type != "cpu" or prediction is None or not prediction.devices:
        return
    if is_replica_plan(plan) and prediction.hardware is None:
        return
    peaks = [int(d.peak_memory_bytes or 0) for d in prediction.devices]
    if len(peaks) != plan.n_devices:
        return  # a prediction recorded for another plan shape: it says nothing of these ranks
    # every pipeline device's stages run on dp x tp ranks (planner.execute.mesh): counted, not listed,
    # since a torchrun job may be large
    copies, world = plan.n_processes // plan.n_devices, plan.n_processes
    here = world if local_world is None else min(local_world, world)
    need, left = 0, here
    for peak in sorted(peaks):
        need, left = need + peak * min(copies, left), left - min(copies, left)
    usable = usable_memory_bytes()
    if usable is None or need <= usable:
        return
    which = f"the plan's {here} ranks" if here == world else f"the {here} ranks torchrun starts here, at least,"
    shown = ", ".join(format_bytes(p) for p in peaks) if len(peaks) <= 8 else f"the largest {format_bytes(max(peaks))}"
    raise PplanError(f"{which} are predicted to need {format_bytes(need)} together (peak per device {shown}"
                     f"{f', {copies} ranks each' if copies > 1 else ''}), above this machine's usable memory of "
                     f"{format_bytes(usable)}: they would fail to allocate",
                     "re-plan with a memory limit (pplan partition --memory) or smaller micro-batches, run it across "
                     "machines with torchrun, or pass --force to start it anyway")


def _device_type(plan: Plan, opts: RunOptions, under_torchrun: bool, local_world: int) -> str:
    want = opts.device
    if want == "cpu":
        return "cpu"
    n_gpu = 0 if no_gpu_device_nodes() else _torch_gpu_count()
    per_machine = local_world
    if want == "auto":
        return "cuda" if 0 < per_machine <= n_gpu else "cpu"
    if n_gpu == 0:
        raise PplanError("--device cuda but this machine has no usable CUDA device", "use --device cpu")
    if per_machine > n_gpu:
        raise PplanError(f"plan needs {per_machine} GPUs on this machine but it has {n_gpu}",
                         "re-plan for fewer devices, or start it across machines with torchrun")
    return "cuda"


def no_gpu_device_nodes() -> bool:
    """Whether this is Linux with no sign of a GPU torch could use: no NVIDIA driver loaded
    (/proc/driver/nvidia: its device nodes may be made only when CUDA first starts) nor device node
    (/dev/nvidia0..., ROCm's /dev/kfd, WSL's /dev/dxg). Then `--device auto` need not import torch
    here (seconds on a small machine, before any rank starts, and the ranks import it anyway)."""
    return sys.platform == "linux" and not (glob.glob("/dev/nvidia[0-9]*") or any(
        os.path.exists(p) for p in ("/proc/driver/nvidia", "/dev/kfd", "/dev/dxg")))


def _torch_gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - a broken CUDA install means: no GPU
        return 0


def check_parallel(plan: Plan, opts: RunOptions | None = None) -> None:
    """Refuse, in one line, a `parallel` layout `pplan run` cannot execute (before any process starts)."""
    par = plan.parallel
    if par is None:
        return
    error = layout_error(par, plan.model)  # the rule the search plans by: the model's tp, then ZeRO with tp
    if error is not None:
        raise error
    if par.tp > 1:
        if opts is not None and opts.calibrate:
            raise PplanError(f"--calibrate with tensor parallelism (tp {par.tp}) is not supported: calibration fits one "
                             "pipeline of whole layers", 'calibrate on a plan with "tp": 1, then run this one')
    if par.pp != plan.n_devices:
        raise PlanError(f"plan's parallel pp {par.pp} is not its {plan.n_devices} pipeline devices",
                        f'make "pp" equal the devices ({plan.n_devices}) or re-plan')
    if par.dp > 1 and opts is not None and opts.calibrate:
        raise PplanError(f"--calibrate with data parallelism (dp {par.dp}) is not supported: calibration fits one pipeline",
                         'calibrate on the plan with "dp": 1, then run this one')


def check_profile_unchanged(plan: Plan, path: str | os.PathLike, sha256: str, *, given: bool = False,
                            hint: str = "re-run `pplan partition` on it, or pass --force") -> None:
    """PlanError unless the profile at `path` (the sha256 of its bytes) is the file the plan was made
    from; a plan that records no sha256 has nothing to compare. `given`: the path came from
    --profile rather than the plan, so the words say "differs" (it is another file), not "changed"."""
    if not plan.profile_sha256 or sha256 == plan.profile_sha256:
        return
    what = "differs from the profile the plan was made from" if given else "changed since the plan was made"
    raise PlanError(f"profile {str(path)!r} {what} (sha256 {sha256[:12]}... on disk, "
                    f"{plan.profile_sha256[:12]}... in the plan)", hint)


def _read_profile(plan: Plan, plan_path: str | None, profile_override: str | None,
                  force: bool) -> tuple[Path | None, Profile | None, list[str]]:
    """(the profile's path, the profile or None when there is none, warnings): the plan's
    profile, or --profile's; a plan's own profile that changed since the plan is refused unless
    --force, another one given with --profile is used and said."""
    profile = None
    warnings: list[str] = []
    path = resolve_profile_path(plan, plan_path, profile_override)
    if path is not None and path.exists():
        # One bounded read (a FIFO or /dev/zero named by the plan is refused, not waited on),
        # hashed and then parsed from the same bytes.
        data = read_bounded_bytes(path, "profile", ProfileError, MAX_PROFILE_BYTES)
        sha256 = hashlib.sha256(data).hexdigest()
        if not profile_override and not force:
            check_profile_unchanged(plan, path, sha256)
        elif profile_override and plan.profile_sha256 and sha256 != plan.profile_sha256:
            # allowed (re-pricing a plan on another machine's profile), but said: its cuts were chosen on the other
            warnings.append(f"predicted with --profile {str(path)!r}, not the profile the plan was made from "
                            f"(sha256 {sha256[:12]}... vs {plan.profile_sha256[:12]}...): the plan's cuts were chosen on that one")
        profile = profile_from_bytes(data, str(path))
    elif profile_override:
        load_profile(profile_override)  # raises the usual "does not exist" error
    return path, profile, warnings


def _check_layer_counts(plan: Plan, n_layers: int, profile: Profile | None, path: Path | None) -> None:
    """The plan's stages, its recorded layer count and the profile all describe the model's layers."""
    end = plan.stages[-1].layers[1]
    if end != n_layers:
        raise PlanError(f"plan stages cover {end} layers but model {plan.model!r} has {n_layers}",
                        "re-plan from a profile of this model")
    if plan.n_layers is not None and plan.n_layers != n_layers:
        raise PlanError(f"plan is for {plan.n_layers} layers but model {plan.model!r} has {n_layers}")
    if profile is not None:
        if profile.n_layers != n_layers:
            raise PlanError(f"profile {str(path)!r} has {profile.n_layers} layers but model {plan.model!r} has {n_layers}",
                            "profile and plan must describe the same model")
        check_profile_model(plan.model, profile)  # after the count: its error is the plainer one


def preflight(plan: Plan, opts: RunOptions, *, plan_path: str | None = None, profile_override: str | None = None,
              force: bool = False, under_torchrun: bool = False, local_world: int | None = None) -> Preflight:
    """Run every check that needs no process group; raise on the first problem."""
    from planner.models import layer_count
    from planner.models.spec import check_input_flags

    check_parallel(plan, opts)
    if not plan.model:
        raise PlanError("plan has no model spec, so `pplan run` cannot build the model",
                        'add "model": "gpt:layers=2,..." (the spec the profile was made from)')
    # the run's own flags only: a profile's recorded input (an hf: model's vocab) is the model's
    check_input_flags(plan.model, input_shape=opts.input_shape, input_dtype=opts.input_dtype, vocab=opts.vocab)
    path, profile, warnings = _read_profile(plan, plan_path, profile_override, force)
    kwargs = model_kwargs(profile, opts)
    # counted and sized here, for every kind (a factory's or hf: model's by building it, which
    # needs the input described), so a model too large for this machine never reaches the ranks
    try:
        n_layers = layer_count(plan.model, **kwargs)
    except ModelTooLargeError as e:
        if plan.n_processes <= cpu_rank_cap():
            raise
        # the plan's model is fixed by the plan, not by a flag: say where such a plan runs
        raise ModelTooLargeError(e.message, f"this plan is for {plan.n_processes:,} processes: run it under torchrun on the "
                             "cluster it was planned for (docs/parallel.md), or plan a smaller model to try it here") from None
    _check_layer_counts(plan, n_layers, profile, path)

    world = plan.n_processes
    world_here = local_world if local_world is not None else world
    device_type = _device_type(plan, opts, under_torchrun, world_here)
    if device_type == "cpu" and not under_torchrun and world > cpu_rank_cap() and not force:
        raise PplanError(f"plan asks for {world} CPU ranks; this machine runs at most {cpu_rank_cap()} "
                         "(more processes measure contention, not the plan)", "pass --force to run anyway")
    from planner.simulate import check_action_count

    # bounded first: building the schedule of 10**6 micro-batches took 1.45 GB and 20 s before the prediction refused it
    check_action_count(plan.schedule, len(plan.stages), plan.n_microbatches)
    plan.pipeline_schedule()  # ScheduleError when torch cannot run these sizes
    resume = 0
    if opts.checkpoint_dir:
        from planner.execute.checkpoint import latest_checkpoint

        found = latest_checkpoint(opts.checkpoint_dir, plan)
        if found is not None:
            resume = found[0]
            opts.check_resume(resume, str(found[1]))  # at/past --steps, or no step left after --warmup
    return Preflight(n_layers=n_layers, profile=profile, device_type=device_type,
                     model_kwargs=kwargs, resume_step=resume, warnings=tuple(warnings))
