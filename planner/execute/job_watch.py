"""A torchrun job stops as one: the rank that fails says why, and every other rank leaves with it.

torchrun stops the processes of the node where a rank fails, not those of the other nodes. They
wait in the process-group join or the next collective for --timeout (300 s by default) and then
fail with a timeout that blames nobody: measured here, a node refusing its missing plan file left
the other waiting the whole --timeout before 'could not join the 2-process job'. Under torchrun
its elastic agent keeps a key-value store at MASTER_ADDR:MASTER_PORT for the life of the job
(TORCHELASTIC_USE_AGENT_STORE=True), reachable before any rank joins. So `failures_shared` posts a
failing rank's one-line reason there (the first reason posted wins: the cause, not the echoes of
peers that lost it), and a thread in every rank polls one counter once a second and, seeing a
reason from another rank, prints it and leaves with its exit code at once, even from inside a
collective where no Python runs on the main thread. A rank whose own error may be the echo of a
peer's (its connection closed under it: a RunError or an unexpected exception) waits up to
_ECHO_S for a reason and leaves with the peer's; the worker posts before it destroys its process
group, so the reason is there before the peers see the group close. Without torchrun's agent
store (the local launcher, which stops the ranks itself; a launcher of one's own) it does nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Iterator

from planner.errors import PplanError, RunError
from planner.textsafe import printable

__all__ = ["failures_shared", "report_failure", "agent_store_address"]

_POLL_S = 1.0
_CONNECT_S = 10.0  # the agent's store is up before any rank starts: a short wait is enough
_ECHO_S = 2.0  # how long an unexpected error waits for a peer's reason it may be the echo of


def agent_store_address() -> tuple[str, int, str] | None:
    """(host, port, key prefix) of torchrun's agent store, or None when this process is not a rank
    of a torchrun job that keeps one. The prefix is per run and per restart: a restarted job does
    not read the reason its previous attempt posted."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    try:
        port = int(os.environ["MASTER_PORT"])
        host = os.environ["MASTER_ADDR"]
    except (KeyError, ValueError):
        return None
    run = os.environ.get("TORCHELASTIC_RUN_ID", "job")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return host, port, f"pplan/{run}/{restart}"


def _connect(host: str, port: int) -> Any:
    from torch.distributed import TCPStore

    return TCPStore(host, port, None, False, timedelta(seconds=_CONNECT_S), wait_for_workers=False)


@dataclass
class _Watch:
    """This process's share of the job's store, while failures_shared runs."""

    store: Any
    """A client of torchrun's agent store."""
    prefix: str
    """Key prefix of this run and restart."""
    rank: int
    """This process's rank."""
    stop: threading.Event = field(default_factory=threading.Event)
    """Set when the watcher should stop (the body ended, or this rank fails itself)."""
    posted: bool = False
    """This rank posted its reason already (the worker posts before tearing its group down)."""


_active: _Watch | None = None


def report_failure(error: BaseException) -> None:
    """Post `error` as this rank's reason, now, if a failures_shared block is active (else
    nothing). The worker calls it before destroying its process group: peers see the group close
    at once, and must find the reason already there when they look."""
    watch = _active
    if watch is None or watch.posted or isinstance(error, SystemExit):
        return
    watch.stop.set()
    watch.posted = True
    if isinstance(error, PplanError):
        text, code = error.one_line(), error.exit_code
    elif isinstance(error, KeyboardInterrupt):
        text, code = "interrupted", 130
    else:
        text, code = _describe(error), 1
    reason = {"rank": watch.rank, "host": socket.gethostname(), "message": text, "exit_code": code}
    with contextlib.suppress(Exception):
        if _may_be_an_echo(error):
            _await_reason(watch)  # a peer that failed first posts before its connections close
        posted = json.dumps(reason)
        kept = watch.store.compare_set(f"{watch.prefix}/reason", "", posted)
        watch.store.add(f"{watch.prefix}/failed", 1)
        if kept.decode("utf-8") == posted:
            # Ours is the reason, and the store lives in node 0's torchrun, which ends soon after
            # a rank there fails: give every watcher one poll to read it before it can go.
            time.sleep(1.5 * _POLL_S)


def _may_be_an_echo(error: BaseException) -> bool:
    """An error that another rank's failure may have caused here (a closed connection, a join or
    collective that failed): not a verdict of this rank's own, which a PplanError other than
    RunError is (its plan, its files, the ranks' disagreement: every rank says it the same way)."""
    if isinstance(error, (SystemExit, KeyboardInterrupt)):
        return False
    return isinstance(error, RunError) or not isinstance(error, PplanError)


def _await_reason(watch: _Watch) -> None:
    """Wait up to _ECHO_S for a reason posted by any rank (a peer that failed first posts before
    its connections close; one killed outright never posts, and then ours stands)."""
    deadline = time.monotonic() + _ECHO_S
    while watch.store.add(f"{watch.prefix}/failed", 0) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)


def _peer_reason(watch: _Watch) -> dict[str, Any] | None:
    """The posted reason when another rank posted it, else None (raises when the store is gone)."""
    if watch.store.add(f"{watch.prefix}/failed", 0) == 0:
        return None
    reason = json.loads(watch.store.get(f"{watch.prefix}/reason"))
    return reason if reason.get("rank") != watch.rank else None


def _peer_error(reason: dict[str, Any]) -> PplanError:
    """The one line a rank leaves with when another rank's failure ended the job."""
    error = PplanError if int(reason.get("exit_code", 1)) == 2 else RunError
    return error(f"rank {reason.get('rank')} on {printable(str(reason.get('host')))} stopped the job: "
                 f"{printable(str(reason.get('message')))}")


def _describe(error: BaseException) -> str:
    """One line for an unexpected error, its root cause last: torch wraps a stage's failure as
    '[Stage 1] failed to run forward: args: ...', the reason being in what it was raised from."""
    def one(e: BaseException) -> str:
        return " ".join(f"{type(e).__name__}: {e}".split())

    root, seen = error, {id(error)}
    while (root.__cause__ or root.__context__) is not None and id(root.__cause__ or root.__context__) not in seen:
        root = root.__cause__ or root.__context__
        seen.add(id(root))
    text = one(error)[:300]
    return text if root is error else f"{text} (caused by {one(root)[:300]})"


def _watch(watch: _Watch) -> None:
    """Poll the failure counter until stopped; on another rank's reason, print it and leave. The
    store going away while this rank still works means node 0's torchrun ended the job (on success
    torchrun's exit barrier keeps it until every node's ranks are done): leave too, saying so."""
    while not watch.stop.wait(_POLL_S):
        try:
            reason = _peer_reason(watch)
        except Exception:  # noqa: BLE001 - the store went away
            if watch.stop.wait(2 * _POLL_S):
                return  # this rank's own body ended meanwhile: the job was over
            _leave(RunError("the job's store at MASTER_ADDR:MASTER_PORT went away while this rank was still working: "
                            "node 0's torchrun ended the job", "its output says why"))
            return
        if reason is None or watch.stop.is_set():
            continue
        _leave(_peer_error(reason))


def _leave(error: PplanError) -> None:
    """Print `error` and end the process at once: the main thread may be inside a collective (C
    code, no Python to raise into)."""
    sys.stderr.write(f"pplan: error: {error.one_line()}\n")
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(error.exit_code)


@contextlib.contextmanager
def failures_shared(rank: int) -> Iterator[None]:
    """For the body: post this rank's failure for the others, and leave on another rank's. A
    failure of the body that follows another rank's (a connection its peer closed) leaves as that
    rank's reason, the cause, not as its own echo."""
    global _active
    where = agent_store_address()
    try:
        # one client per rank (a large job's ranks all connect to node 0's agent): torch's
        # TCPStore client serializes its operations, so the watcher and a post can share it
        store = _connect(where[0], where[1]) if where else None
    except Exception:  # noqa: BLE001 - no store to share through: the peers' timeout still ends them
        store = None
    if store is None or where is None:
        yield
        return
    watch = _Watch(store=store, prefix=where[2], rank=rank)
    _active = watch
    threading.Thread(target=_watch, args=(watch,), daemon=True, name="pplan-job-watch").start()
    try:
        yield
    except BaseException as e:
        report_failure(e)
        reason = None
        if _may_be_an_echo(e):
            with contextlib.suppress(Exception):  # the store may be gone with the job
                reason = _peer_reason(watch)
        if reason is not None:
            raise _peer_error(reason) from e
        raise
    finally:
        watch.stop.set()
        _active = None
