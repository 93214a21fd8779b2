"""Background training processes that keep the machine as busy as a pipeline's other ranks.

`pplan profile --co-run K` measures every layer while K other processes train the same model
(forward, backward and Adam step, over and over) at the micro-batch size being profiled and the
profile's thread count. On a CPU machine the ranks of a pipeline share caches and memory
bandwidth: a memory-bound layer (a wide Linear at a small batch, the optimizer step that streams
weights, gradients and Adam moments) runs 1.3-1.6x slower beside another rank than alone, which
a layer profiled alone never sees (docs/simulator.md, "Why per-layer times do not add up").

Each worker runs `_worker_main`, forked from a warm-start server as the ranks of `pplan run` are
(planner/warm_start.py: torch is imported once per profiler process, not once per worker), or a
fresh `python -c` with PPLAN_WARM_START=0; not multiprocessing's spawn, which re-runs the
caller's `__main__` and breaks scripts without a main guard. Each worker has its own session,
so a terminal's Ctrl-C reaches only the profiler, which then closes the workers. It talks over
its pipes:

- parent -> worker (stdin): `batch N` lines; closing stdin (or the parent dying: only the parent
  holds the pipe's other end) stops it.
- worker -> parent (its original stdout, kept for this alone): `ready N` once it has finished a
  whole warm-up iteration at size N, or `error TEXT` before it exits. Anything the model prints
  goes to stderr, which a temporary file collects for the error message.

The parent waits for every `ready` before measuring (a signal, not a sleep), and `CoRun.close`
stops every worker however the profile ends: stdin closed, then SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

from planner.errors import PplanError
from planner.master_weights import is_16bit, with_fp32_masters
from planner.profiling.metadata import MAX_CO_RUN
from planner.warm_start import WarmProcess, start_rank_process

__all__ = ["MAX_CO_RUN", "CoRun", "check_co_run"]

# Safety net only (a worker stuck in the model's own code): the ready wait normally ends with
# the worker's signal or its exit, and a first iteration of a model this machine can train in
# a pipeline takes seconds.
_READY_TIMEOUT_S = 900.0
_STOP_GRACE_S = 10.0  # to finish the iteration under way before SIGTERM
_ERROR_TAIL = 300  # characters of a worker's stderr in the one-line error


def check_co_run(co_run: int, threads: int | None, cores: int, device: str = "cpu") -> None:
    """Refuse a co-run that cannot measure what it is for (values and a fix in the message)."""
    if not isinstance(co_run, int) or isinstance(co_run, bool) or co_run < 0:
        raise PplanError(f"co-run {co_run!r} must be a whole number >= 0", "e.g. --co-run 1 for a 2-rank pipeline")
    if co_run > MAX_CO_RUN:
        raise PplanError(f"co-run {co_run} is more than {MAX_CO_RUN} processes", "give the pipeline's ranks minus one")
    if co_run == 0:
        return
    if not device.startswith("cpu"):
        raise PplanError(f"--co-run {co_run} with --device {device}: co-running measures ranks that share one CPU's "
                         "memory bandwidth; each GPU has its own memory", "profile GPUs without --co-run")
    need = (co_run + 1) * (threads or 1)
    if need > cores:
        raise PplanError(f"--co-run {co_run} with {threads or 1} thread(s) each needs {need} cores (the profiler and "
                         f"{co_run} background processes), this process may use {cores}",
                         "the ranks of a CPU pipeline get cores / ranks threads each: lower --threads or --co-run "
                         "(an oversubscribed co-run measures CPU sharing, which the sched timer removes, not memory sharing)")


def _child_env(threads: int) -> dict[str, str]:
    """The parent's import path (a source checkout, a `module:factory` beside the working
    directory) and thread count, for a child (warm or fresh)."""
    root = str(Path(__file__).resolve().parents[2])
    paths = [root] + [os.path.abspath(p or os.getcwd()) for p in sys.path]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if os.path.isdir(p)))
    # Read by a fresh child's OpenMP as it loads; a warm child's torch (and OpenMP) was loaded by
    # the server, so there `_train`'s set_num_threads alone sets the count (the same either way)
    env["OMP_NUM_THREADS"] = str(threads)
    return env


class CoRun:
    """K background processes training `spec`; a context manager (`with CoRun(...) as bg:`)."""

    def __init__(self, k: int, spec: str, *, threads: int, dtype: str = "float32", seed: int = 0,
                 input_shape: tuple[int, ...] | None = None, input_dtype: str = "float", vocab: int | None = None):
        self.k = k
        self._config = json.dumps({"spec": spec, "threads": threads, "dtype": dtype, "seed": seed,
                                   "input_shape": list(input_shape) if input_shape else None,
                                   "input_dtype": input_dtype, "vocab": vocab})
        self._env = _child_env(threads)
        self._procs: list[WarmProcess | subprocess.Popen[bytes]] = []
        self._errs: list[IO[bytes]] = []
        self._buf: dict[int, bytes] = {}

    @property
    def pids(self) -> list[int]:
        """Process ids of the workers started (for tests and diagnostics)."""
        return [p.pid for p in self._procs]

    def start(self) -> "CoRun":
        """Start the K workers (they build the model; `set_batch` waits for them)."""
        try:
            for i in range(self.k):
                err = tempfile.TemporaryFile(prefix="pplan-corun-")
                self._errs.append(err)
                self._procs.append(start_rank_process("planner.profiling.corun:_worker_main", [self._config], self._env,
                                                      name=f"pplan-corun{i}", stdin=subprocess.PIPE,
                                                      stdout=subprocess.PIPE, stderr=err))
        except BaseException:
            self.close()
            raise
        return self

    def __enter__(self) -> "CoRun":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def set_batch(self, size: int) -> None:
        """Make every worker train at micro-batch `size`; return once each has done a whole
        iteration at that size (its warm-up), so measuring starts under the full load."""
        for p in self._procs:
            try:
                p.stdin.write(f"batch {size}\n".encode())  # type: ignore[union-attr]
                p.stdin.flush()  # type: ignore[union-attr]  # a fresh worker's pipe is buffered (Popen's default)
            except (BrokenPipeError, OSError):
                pass  # it has exited: the wait below reports why
        waiting = {p.stdout.fileno(): i for i, p in enumerate(self._procs)}  # type: ignore[union-attr]
        sel = selectors.DefaultSelector()
        try:
            for fd in waiting:
                sel.register(fd, selectors.EVENT_READ)
            deadline = time.monotonic() + _READY_TIMEOUT_S
            while waiting:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PplanError(f"co-run worker {waiting[next(iter(waiting))]} did not finish an iteration at "
                                     f"micro-batch size {size} within {_READY_TIMEOUT_S:.0f} s",
                                     "profile without --co-run, or smaller micro-batch sizes")
                for key, _ in sel.select(left):
                    fd = key.fd
                    chunk = os.read(fd, 4096)
                    if not chunk:
                        self._fail(waiting[fd], f"exited before it was ready at micro-batch size {size}")
                    self._buf[fd] = self._buf.get(fd, b"") + chunk
                    while b"\n" in self._buf[fd]:
                        line, self._buf[fd] = self._buf[fd].split(b"\n", 1)
                        text = line.decode(errors="replace").strip()
                        if text.startswith("error "):
                            self._fail(waiting[fd], text[6:])
                        if text == f"ready {size}" and fd in waiting:
                            sel.unregister(fd)
                            del waiting[fd]
        finally:
            sel.close()

    def check(self) -> None:
        """Raise if a worker has died: the measurements were not all taken under the co-run."""
        for i, p in enumerate(self._procs):
            if p.poll() is not None:
                self._fail(i, f"exited (code {p.returncode}) while the layers were being measured")

    def _fail(self, i: int, what: str) -> None:
        proc, err = self._procs[i], self._errs[i]
        try:
            proc.wait(timeout=_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        err.seek(0)
        tail = " ".join(err.read().decode(errors="replace").split())[-_ERROR_TAIL:]
        raise PplanError(f"co-run worker {i} (pid {proc.pid}) {what}" + (f": {tail}" if tail else ""),
                         "check that the model trains at this micro-batch size, or profile without --co-run")

    def close(self) -> None:
        """Stop every worker and reap it; safe to call twice and after a failed start."""
        for p in self._procs:
            for stream in (p.stdin, p.stdout):
                try:
                    if stream is not None:
                        stream.close()  # stdin's EOF is the worker's signal to stop
                except OSError:
                    pass
        for p in self._procs:
            for action, grace in ((None, _STOP_GRACE_S), (p.terminate, 5.0), (p.kill, None)):
                if action is not None:
                    try:
                        action()
                    except ProcessLookupError:
                        pass
                try:
                    p.wait(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
        for err in self._errs:
            err.close()
        self._procs, self._errs = [], []


def _on_device(x: Any, dtype: Any) -> Any:
    """A batch as the profiler feeds it (CPU only: co-running is refused on GPUs)."""
    import torch

    if isinstance(x, tuple):
        return tuple(_on_device(t, dtype) for t in x)
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.to(dtype=dtype)
    return x


def _worker_main(config: str) -> None:
    """One background worker (module docstring) training as `config` (CoRun's JSON) says, until
    stdin closes. SIGINT keeps its default: in its own session, a terminal's Ctrl-C never reaches it."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # the model's own prints must not look like protocol lines
    try:
        _train(json.loads(config), proto)
    except Exception as e:  # reported to the parent, which raises it as one line
        proto.write("error " + " ".join(f"{type(e).__name__}: {e}".split())[:_ERROR_TAIL] + "\n")
        raise SystemExit(1) from None


def _train(cfg: dict[str, Any], proto: IO[str]) -> None:
    import torch

    from planner.allocator import keep_freed_memory
    from planner.models import build_model

    keep_freed_memory()  # as the ranks it stands for (planner.allocator)

    torch.set_num_threads(cfg["threads"])
    shape = tuple(cfg["input_shape"]) if cfg["input_shape"] else None
    bundle = build_model(cfg["spec"], cfg["seed"], input_shape=shape, input_dtype=cfg["input_dtype"], vocab=cfg["vocab"])
    dtype = getattr(torch, cfg["dtype"])  # one of options.DTYPE_NAMES, checked by the profiler
    layers = bundle.layers.to(dtype=dtype).train()
    params = [p for p in layers.parameters() if p.requires_grad]
    # what the profile's optimizer_ms times, and `pplan run` steps: over 16-bit weights, fp32 masters
    opt = (with_fp32_masters(torch.optim.Adam) if any(is_16bit(p) for p in params) else torch.optim.Adam)(params, lr=1e-3)
    wanted: list[int] = []
    news, stop = threading.Event(), threading.Event()

    def listen() -> None:  # a thread, so that training never blocks on the pipe
        for line in sys.stdin:
            if line.startswith("batch "):
                wanted.append(int(line.split()[1]))
                news.set()
        stop.set()  # EOF: the parent closed stdin, or died
        news.set()

    threading.Thread(target=listen, daemon=True).start()
    news.wait()  # nothing to train before the first size is asked for
    handled, size, batch, announced = 0, 0, None, True
    while not stop.is_set():
        if len(wanted) > handled:  # every request is answered, even a repeated size
            handled = len(wanted)
            if wanted[handled - 1] != size:
                size, batch = wanted[handled - 1], None
                x, target = bundle.make_batch(size, cfg["seed"])
                batch = (_on_device(x, dtype), _on_device(target, dtype))
            announced = False
        if batch is None:
            break  # stopped before any size was asked for
        bundle.loss_fn(layers(batch[0]), batch[1]).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if not announced:  # a whole iteration at this size is done: the load is on
            proto.write(f"ready {size}\n")
            announced = True
