"""profile_model: build a model, measure every layer at every micro-batch size, return a Profile.

Each micro-batch size gets a fresh batch from the model's `make_batch(size, seed)` that flows
through the layers in order, each layer measured on the real output of the one before
(planner.profiling.measure describes the method). A chain model's times are then taken again
with each layer inside whole forward and backward passes of the model, in order, as a stage runs
them (planner.profiling.inorder: alone, layers ran 12-30% faster than in a pipeline). The
optimizer step is measured once per layer: it does not depend on the micro-batch size.

A model that is not a chain (its `layers` is a planner.graph.GraphSequential) is measured
through its LayerGraph: layer i is `lg.layer_module(i)`, called on the real values it reads
(`lg.layer_inputs(i)`, each detached and requiring grad as a stage receives it) and giving
the real values later layers read. Its output_bytes keep only what the next layer alone
reads; every other value becomes a skip edge (`# edge:` line) whose bytes per sample are
measured at the largest micro-batch size, in the profiled dtype.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections import defaultdict
from typing import Any, Callable

import numpy as np
import torch

from planner.allocator import keep_freed_memory
from planner.errors import ModelSpecError, PplanError
from planner.hostinfo import usable_cores
from planner.models import build_model
from planner.models.spec import check_input_flags
from planner.profiling.batch import MESSAGE_LIMIT, inputs_to_device, make_batch, target_bytes_per_sample, to_device
from planner.profiling.corun import CoRun, check_co_run
from planner.profiling.flops import count_failures, uncounted_meta
from planner.profiling.inorder import layer_timing_text, retime_in_order
from planner.profiling.measure import RunQueueWait, measure_layer
from planner.profiling.options import DTYPE_NAMES, ProfileOptions
from planner.profiling.optstep import optimizer_ms, optimizer_workspace_bytes
from planner.profiling.profile import Profile, make_profile
from planner.profiling.progress import CO_RUN, LAYER, OPTIMIZER, ProfileProgress, Step, profile_progress
from planner.profiling.room import check_batch_fits, check_next_size_fits, check_co_run_memory
from planner.profiling.runmeta import profile_meta
from planner.profiling.saved import SavedTensors, checkpoint_extra_bytes, target_tensors, tensor_bytes
from planner.profiling.stageloss import compact_loss
from planner.warm_start import prestart

__all__ = ["DTYPES", "profile_model", "measure_profile", "resolve_device", "check_batch_fits"]

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}
"""Profile dtype name -> torch dtype (names checked by planner.profiling.options.ProfileOptions)."""
_COLUMNS = (
    "fwd_ms", "fwd_ms_std", "bwd_ms", "bwd_ms_std", "bwd_input_ms", "bwd_weight_ms",
    "activation_bytes", "shared_input_bytes", "output_bytes", "flops", "cuda_peak_bytes", "workspace_bytes",
    "output_saved_bytes", "input_saved_bytes", "wgrad_bytes", "w_workspace_bytes", "w_carry_bytes",
)


def resolve_device(device: str) -> torch.device:
    """'cpu', 'cuda' or 'cuda:N' -> torch.device, checking that it exists."""
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise PplanError(f"unknown device {device!r}", "use cpu, cuda or cuda:N") from None
    if dev.type not in ("cpu", "cuda"):
        raise PplanError(f"device {device!r} is not supported", "use cpu, cuda or cuda:N")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise PplanError(f"--device {device}: CUDA is not available (torch {torch.__version__})", "profile on cpu, or install a CUDA build of torch on a GPU machine")
        index = dev.index or 0
        if index >= torch.cuda.device_count():
            raise PplanError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s)")
        dev = torch.device("cuda", index)
    return dev


def _measure_checked(spec: str, size: int, i: int, name: str, layer: torch.nn.Module, inputs: Any,
                     loss_bundle: Any, target: Any, *, warmup: int, repeats: int, seed: int,
                     prev: Any, timer: str) -> tuple[Any, Any, Any]:
    """measure_layer on layer i (with the loss when `loss_bundle` is given: the last layer);
    a failure of the model's own code becomes one line naming the layer and size."""
    try:
        return measure_layer(  # the loss as the run computes it (planner.profiling.stageloss)
            layer, inputs, loss_fn=compact_loss(loss_bundle.loss_fn) if loss_bundle is not None else None,
            target=target if loss_bundle is not None else None, warmup=warmup, repeats=repeats,
            grad_seed=(seed * 100_003 + i) % 2**63, prev_saved=prev, name=name, timer=timer,
        )
    except PplanError:
        raise
    except Exception as e:
        raise _failure(spec, i, name, size, e) from e


def _measure_into(cols: dict, k: int, spec: str, size: int, i: int, name: str, layer: torch.nn.Module, inputs: Any,
                  loss_bundle: Any, target: Any, *, prev: Any, **kwargs: Any) -> tuple[Any, Any]:
    """Measure layer i, store its figures in column k of `cols`, free what the previous layer
    saved (it was kept only so shared storage counts once); returns (outputs, what i saved)."""
    with count_failures() as uncounted:
        m, outputs, saved = _measure_checked(spec, size, i, name, layer, inputs, loss_bundle, target, prev=prev, **kwargs)
    if prev is not None:
        prev.release()
    for c in _COLUMNS:
        cols[c][i, k] = getattr(m, c)
    if uncounted:  # torch's counter failed: 0 in the file, the layer named in its metadata (uncounted_meta)
        cols["flops"][i, k] = np.nan
    cols["checkpoint_extra_bytes"][i, k] = checkpoint_extra_bytes(
        outputs, loss_bundle.loss_fn if loss_bundle is not None else None, target)
    if loss_bundle is not None:  # what the loss saves of its target is the batch's (saved.target_tensors)
        held = saved.bytes_of(target_tensors(target))
        cols["activation_bytes"][i, k] -= min(held, cols["activation_bytes"][i, k])
        if cols["workspace_bytes"][i, k] > 0:  # the peak less the activations: the target was never in the peak
            cols["workspace_bytes"][i, k] += held
    return outputs, saved


def _failure(spec: str, index: int, name: str, size: int, e: Exception) -> PplanError:
    # CPU allocations that fail raise a plain RuntimeError ("can't allocate memory"), not OutOfMemoryError
    if isinstance(e, torch.OutOfMemoryError) or (isinstance(e, RuntimeError) and "allocate memory" in str(e)):
        return PplanError(f"model {spec!r}: out of memory in layer {index} ({name}) at micro-batch size {size}", "profile smaller micro-batch sizes")
    text = " ".join(str(e).split())
    if len(text) > MESSAGE_LIMIT:
        text = text[:MESSAGE_LIMIT] + "..."
    return ModelSpecError(f"model {spec!r}: layer {index} ({name}) failed at micro-batch size {size}: {type(e).__name__}: {text}", "run with --debug for the traceback")


def _warm_up(bundle: Any, layers: torch.nn.Module, size: int, seed: int, dev: torch.device, dtype: torch.dtype) -> None:
    """One untimed training step of the whole model: first-call costs (allocator growth,
    kernel selection, lazy initialisation) would otherwise land on the first measurements."""
    x, target = make_batch(bundle, bundle.spec, size, seed)
    move = inputs_to_device if getattr(layers, "graph", None) is not None else to_device
    try:
        bundle.loss_fn(layers(move(x, dev, dtype)), to_device(target, dev, dtype)).backward()
    except PplanError:
        raise
    except Exception:
        return  # measure_layer reports the failure with the layer that causes it
    finally:
        layers.zero_grad(set_to_none=True)


def profile_model(
    spec: str,
    micro_batch_sizes: list[int],
    *,
    device: str = "cpu",
    dtype: str = "float32",
    warmup: int = 3,
    repeats: int = 15,
    seed: int = 0,
    threads: int | None = 1,
    input_shape: tuple[int, ...] | None = None,
    input_dtype: str = "float",
    vocab: int | None = None,
    timer: str = "sched",
    command: str | None = None,
    on_step: Callable[[int, int, str], None] | None = None,
    co_run: int = 0,
) -> Profile:
    """Measure every layer of `spec` at every size; `on_step(done, total, note)` after each.

    `threads`: torch CPU threads while measuring, as `pplan profile --threads` (default 1, what
    each rank of a run with as many ranks as cores gets; None keeps the process's setting). A
    profile measured with more threads than the run's ranks get predicts them too fast: 2
    threads made a gpt layer 0.52x and an MLP layer 0.63x of its 1-thread time on the 2-core
    development machine (docs/simulator.md).

    `co_run`: K background processes train the same model at each size and thread count while
    every layer is measured (planner.profiling.corun): a CPU pipeline's other ranks, which slow
    memory-bound layers and the optimizer step by sharing memory bandwidth. 0: measured alone."""
    opts = ProfileOptions(tuple(micro_batch_sizes), device=device, dtype=dtype, warmup=warmup, repeats=repeats,
                          seed=seed, threads=threads, timer=timer, co_run=co_run, input_shape=input_shape,
                          input_dtype=input_dtype, vocab=vocab)  # every argument checked here
    check_input_flags(spec, input_shape=input_shape, vocab=vocab,  # a built-in would ignore them
                      input_dtype=None if input_dtype == "float" else input_dtype)
    return measure_profile(spec, opts, command=command, on_step=on_step)


def measure_profile(spec: str, opts: ProfileOptions, *, command: str | None = None,
                    on_step: Callable[[int, int, str], None] | None = None) -> Profile:
    """profile_model with its settings as one checked record (what `pplan profile` builds)."""
    sizes = list(opts.micro_batch_sizes)
    device, dtype, warmup, repeats, seed = opts.device, opts.dtype, opts.warmup, opts.repeats, opts.seed
    threads, timer, co_run = opts.threads, opts.timer, opts.co_run
    input_shape, input_dtype, vocab = opts.input_shape, opts.input_dtype, opts.vocab
    keep_freed_memory()  # as the run's ranks do (planner.allocator)
    timer = _resolve_timer(timer)
    check_co_run(co_run, threads or torch.get_num_threads(), usable_cores(), device)
    if co_run:
        prestart()  # the workers' server imports torch while this process builds the model
    dev, tdtype = resolve_device(device), DTYPES[dtype]
    bundle = build_model(spec, seed, input_shape=input_shape, input_dtype=input_dtype, vocab=vocab)
    check_batch_fits(bundle, spec, sizes, dev, seed)
    check_co_run_memory(bundle, spec, co_run)
    stack = contextlib.ExitStack()  # closes the co-run however profiling ends
    bg = stack.enter_context(CoRun(co_run, spec, threads=threads or torch.get_num_threads(), dtype=dtype, seed=seed,
                                   input_shape=input_shape, input_dtype=input_dtype, vocab=vocab)) if co_run else None
    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    started = time.perf_counter()
    try:
        layers, lg, named = _layers_to_measure(bundle, dev, tdtype)
        cols = {c: np.zeros((len(named), len(sizes))) for c in (*_COLUMNS, "checkpoint_extra_bytes")}
        progress = profile_progress(opts.micro_batch_sizes, [_trainable(layer) for _, layer in named],
                                    co_run=bg is not None, device=dev.type, warmup=warmup, repeats=repeats, on_step=on_step)
        progress.start()
        _warm_up(bundle, layers, sizes[0], seed, dev, tdtype)
        progress.measuring()
        input_bytes, skip, timing = _measure_sizes(named, lg, bundle, spec, opts, cols, dev=dev, dtype=tdtype, timer=timer,
                                           progress=progress, bg=bg)
        _size_free_columns(cols, named, len(sizes), dev, warmup=warmup, repeats=repeats, timer=timer, progress=progress)
        if bg is not None:
            bg.check()  # every figure above was measured with all workers running
            stack.close()
        meta = profile_meta(spec, bundle, seed=seed, dev=dev, dtype=dtype, command=command, input_bytes=input_bytes,
                             target_bytes=target_bytes_per_sample(bundle, spec, sizes[0], seed),
                             warmup=warmup, repeats=repeats, timer=timer, co_run=co_run, input_shape=input_shape,
                             input_dtype=input_dtype, vocab=vocab, started=started) | uncounted_meta(cols["flops"])
        meta["layer_timing"] = timing
        if lg is not None:
            edges = [(src, cons[-1], int(round(b / sizes[-1])), cons[:-1]) for (src, cons), b in sorted(skip.items())]
            return make_profile([n for n, _ in named], sizes, cols, meta, skip_edges=edges)
        return make_profile([n for n, _ in named], sizes, cols, meta)
    finally:
        stack.close()
        torch.set_num_threads(old_threads)


def _measure_sizes(named: list[tuple[str, torch.nn.Module]], lg: Any, bundle: Any, spec: str, opts: ProfileOptions,
                   cols: dict[str, np.ndarray], *, dev: torch.device, dtype: torch.dtype, timer: str,
                   progress: ProfileProgress, bg: Any) -> tuple[float, dict[tuple[int, tuple[int, ...]], float], str]:
    """Every layer at every micro-batch size into `cols`, the co-run workers (if any) training at
    each size first; returns the input's bytes per sample, a traced model's skip tensors and how
    the layers were timed (the profile's layer_timing line)."""
    sizes = list(opts.micro_batch_sizes)
    input_bytes = 0.0
    skip: dict[tuple[int, tuple[int, ...]], float] = {}
    alone: list[int] = []
    for k, size in enumerate(sizes):
        check_next_size_fits(cols, [n for n, _ in named], sizes, k, spec, dev)
        if bg is not None:  # the workers train at this size before any layer is timed
            bg.set_batch(size)
            progress.done(Step(CO_RUN, size, -1), f"co-run at micro-batch {size}")
        if lg is not None:
            input_bytes, skip = _measure_graph(
                lg, named, bundle, spec, size, k, cols, dev=dev, dtype=dtype, seed=opts.seed, warmup=opts.warmup,
                repeats=opts.repeats, timer=timer, progress=progress)
            gc.collect()
            continue
        input_bytes, in_order = _measure_chain(named, bundle, spec, size, k, cols, dev=dev, dtype=dtype, seed=opts.seed,
                                               warmup=opts.warmup, repeats=opts.repeats, timer=timer, progress=progress)
        alone += [] if in_order else [size]
    return input_bytes, skip, layer_timing_text(alone, graph=lg is not None)


def _layers_to_measure(bundle: Any, dev: torch.device,
                       dtype: torch.dtype) -> tuple[torch.nn.Module, Any, list[tuple[str, torch.nn.Module]]]:
    """The model on the device in training mode, its LayerGraph (None for a chain), and its named layers."""
    layers = bundle.layers.to(device=dev, dtype=dtype).train()
    lg = getattr(layers, "graph", None)  # a traced non-chain model (planner.graph.GraphSequential)
    if lg is not None:
        return layers, lg, [(lg.names[i], lg.layer_module(i).train()) for i in range(lg.n_layers)]
    return layers, None, list(layers.named_children())


def _received(value: Any) -> Any:
    """A value as a pipeline stage receives it: detached, floating tensors requiring grad."""
    if isinstance(value, torch.Tensor):
        return value.detach().requires_grad_(value.is_floating_point())
    return value


def _measure_graph(lg: Any, named: list[tuple[str, torch.nn.Module]], bundle: Any, spec: str, size: int, k: int,
                   cols: dict[str, np.ndarray], *, dev: torch.device, dtype: torch.dtype, seed: int, warmup: int,
                   repeats: int, timer: str, progress: ProfileProgress) -> tuple[float, dict[tuple[int, tuple[int, ...]], float]]:
    """Measure every layer of a traced model at one size (module docstring); fills column k.

    Returns (input bytes per sample, skip-edge bytes at this size keyed by (src, readers)).
    """
    x, target = make_batch(bundle, spec, size, seed)
    inputs = inputs_to_device(x, dev, dtype)
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    target = to_device(target, dev, dtype)
    env: dict[str, Any] = dict(zip(lg.input_names, inputs))
    last_reader = {v.name: max(v.consumers) for v in lg.values}
    by_producer: dict[int, list[Any]] = defaultdict(list)
    for v in lg.values:
        by_producer[v.producer].append(v)
    skip: dict[tuple[int, tuple[int, ...]], float] = defaultdict(float)
    n = len(named)
    prev: SavedTensors | None = None
    for i, (name, layer) in enumerate(named):
        args = tuple(env[v] if i == 0 else _received(env[v]) for v in lg.layer_inputs(i))
        last = i == n - 1
        outs, prev = _measure_into(cols, k, spec, size, i, name, layer, args, bundle if last else None, target,
                                   warmup=warmup, repeats=repeats, seed=seed, prev=prev, timer=timer)
        made = dict(zip(lg.layer_outputs(i), outs))
        if last:
            cols["output_bytes"][i, k] = tensor_bytes(outs[0])
        else:  # the chain edge stays in output_bytes; the rest travels further: skip edges
            chain = 0
            for v in by_producer[i]:
                nbytes = tensor_bytes(made[v.name])
                if v.consumers == (i + 1,):
                    chain += nbytes
                else:
                    skip[(i, v.consumers)] += nbytes
            cols["output_bytes"][i, k] = chain
        env.update(made)
        for dead in [name_ for name_ in env if last_reader.get(name_, -1) <= i]:
            del env[dead]  # read by no later layer: free it, as a pipeline would
        progress.done(Step(LAYER, size, i), f"micro-batch {size} {name}")
    if prev is not None:
        prev.release()
    return tensor_bytes(inputs) / size, dict(skip)


def _size_free_columns(cols: dict[str, np.ndarray], named: list[tuple[str, torch.nn.Module]], n_sizes: int,
                       dev: torch.device, *, warmup: int, repeats: int, timer: str, progress: ProfileProgress) -> None:
    """The columns that do not depend on the micro-batch size: the optimizer step (timed now, so
    under the co-run too) and parameter bytes, repeated for every size; no CUDA peak off CUDA."""
    opt, work = np.zeros(len(named)), np.zeros(len(named))
    for i, (name, layer) in enumerate(named):  # a step each: an optimizer step costs as much as its parameters
        opt[i] = optimizer_ms(layer, warmup=warmup, repeats=repeats, timer=timer)
        work[i] = optimizer_workspace_bytes(layer)
        progress.done(Step(OPTIMIZER, 0, i), f"optimizer step {name}")
    cols["optimizer_ms"] = np.repeat(opt[:, None], n_sizes, axis=1)
    param_bytes = [sum(p.numel() * p.element_size() for p in layer.parameters()) for _, layer in named]
    cols["param_bytes"] = np.repeat(np.array(param_bytes, dtype=float)[:, None], n_sizes, axis=1)
    cols["optimizer_workspace_bytes"] = np.repeat(work[:, None], n_sizes, axis=1)
    if dev.type != "cuda":
        del cols["cuda_peak_bytes"]


def _trainable(layer: torch.nn.Module) -> int:
    """Parameters the optimizer steps (what its measurement costs)."""
    return sum(p.numel() for p in layer.parameters() if p.requires_grad)


def _resolve_timer(timer: str) -> str:
    """The timer to use: `sched` (wall minus run-queue wait) where the kernel reports waits, else wall."""
    if timer == "sched":
        probe = RunQueueWait()
        timer = "sched" if probe.available else "wall"  # not every kernel reports run-queue waits
        probe.close()
    return timer


def _measure_chain(named: list[tuple[str, torch.nn.Module]], bundle: Any, spec: str, size: int, k: int,
                   cols: dict[str, np.ndarray], *, dev: torch.device, dtype: torch.dtype, seed: int, warmup: int,
                   repeats: int, timer: str, progress: ProfileProgress) -> tuple[float, bool]:
    """Measure a chain model's layers at one size, each on the real output of the one before,
    into column k of `cols`; returns the model input's bytes per sample and whether the times
    were taken in model order (else alone: a whole pass would not fit)."""
    x, target = make_batch(bundle, spec, size, seed)
    h, target = to_device(x, dev, dtype), to_device(target, dev, dtype)
    first, input_bytes = h, h.numel() * h.element_size() / size
    prev: SavedTensors | None = None
    for i, (name, layer) in enumerate(named):
        inp = h if i == 0 else h.detach().requires_grad_(h.is_floating_point())
        last = i == len(named) - 1
        h, prev = _measure_into(cols, k, spec, size, i, name, layer, inp, bundle if last else None, target,
                                warmup=warmup, repeats=repeats, seed=seed, prev=prev, timer=timer)
        if not last:  # the last layer's step also holds the passes in order, below
            progress.done(Step(LAYER, size, i), f"micro-batch {size} {name}")
    if prev is not None:
        prev.release()
    del h, inp, prev
    gc.collect()
    # the times a stage sees: each layer inside whole passes, in order (planner.profiling.inorder);
    # priced by the progress estimate as part of the last layer's step, which grows with the size as they do
    in_order = retime_in_order([layer for _, layer in named], first, compact_loss(bundle.loss_fn), target, cols, k,
                               warmup=warmup, repeats=repeats, timer=timer)
    progress.done(Step(LAYER, size, len(named) - 1), f"micro-batch {size} {named[-1][0]}, then every layer in order")
    del first, x, target
    gc.collect()
    return input_bytes, in_order
