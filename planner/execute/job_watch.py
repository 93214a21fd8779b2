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
collective where no Python runs on the main thread. Without torchrun's agent store (the local
launcher, which stops the ranks itself; a launcher of one's own) it does nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
from datetime import timedelta
from typing import Any, Iterator

from planner.errors import PplanError
from planner.textsafe import printable

__all__ = ["failures_shared", "agent_store_address"]

_POLL_S = 1.0
_CONNECT_S = 10.0  # the agent's store is up before any rank starts: a short wait is enough


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


def _post(store: Any, prefix: str, rank: int, error: BaseException) -> None:
    """Post this rank's reason, unless a reason is there already; then count it."""
    if isinstance(error, PplanError):
        text, code = error.one_line(), error.exit_code
    elif isinstance(error, KeyboardInterrupt):
        text, code = "interrupted", 130
    else:
        text, code = " ".join(f"{type(error).__name__}: {error}".split())[:500], 1
    reason = {"rank": rank, "host": socket.gethostname(), "message": text, "exit_code": code}
    store.compare_set(f"{prefix}/reason", "", json.dumps(reason))
    store.add(f"{prefix}/failed", 1)


def _watch(store: Any, prefix: str, rank: int, stop: threading.Event) -> None:
    """Poll the failure counter until stopped; on another rank's reason, print it and leave."""
    try:
        while not stop.wait(_POLL_S):
            if store.add(f"{prefix}/failed", 0) == 0:
                continue
            reason = json.loads(store.get(f"{prefix}/reason"))
            if reason.get("rank") == rank or stop.is_set():
                return  # our own: the main thread is already unwinding with it
            code = int(reason.get("exit_code", 1))
            sys.stderr.write(f"pplan: error: rank {reason.get('rank')} on {printable(str(reason.get('host')))} "
                             f"stopped the job: {printable(str(reason.get('message')))}\n")
            sys.stderr.flush()
            sys.stdout.flush()
            # The main thread may be inside a collective (C code, no Python to raise into): leave now.
            os._exit(code if 0 < code < 256 else 1)
    except Exception:  # noqa: BLE001 - the store went away with the job: nothing left to watch
        return


@contextlib.contextmanager
def failures_shared(rank: int) -> Iterator[None]:
    """For the body: post this rank's failure for the others, and leave on another rank's."""
    where = agent_store_address()
    try:
        # two clients: the watcher polls on its own while the main thread may post
        store, watched = (_connect(where[0], where[1]), _connect(where[0], where[1])) if where else (None, None)
    except Exception:  # noqa: BLE001 - no store to share through: the peers' timeout still ends them
        store = None
    if store is None or where is None:
        yield
        return
    prefix = where[2]
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(watched, prefix, rank, stop), daemon=True, name="pplan-job-watch")
    watcher.start()
    try:
        yield
    except BaseException as e:
        stop.set()
        if not isinstance(e, SystemExit):
            with contextlib.suppress(Exception):
                _post(store, prefix, rank, e)
        raise
    finally:
        stop.set()
