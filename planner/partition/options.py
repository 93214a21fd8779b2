"""`pplan partition`'s options as text -> PartitionSettings / ClusterSettings: the one place that parses them.

The command declares its options and hands their text here, so a library user writing
`settings_from_options(devices=4, memory="16GiB", global_batch=64, microbatches="8")` gets the
same parsing and the same one-line errors as the command line.
"""

from __future__ import annotations

import os

from planner.cluster import Cluster, load_cluster
from planner.errors import PplanError
from planner.hardware import load_hardware
from planner.limits import DEFAULT_BANDWIDTH, DEFAULT_ILP_TIME_LIMIT, DEFAULT_LATENCY_MS, check_time_limit
from planner.parallel import checked_grad_sync
from planner.partition.job import ClusterSettings
from planner.partition.search import PartitionSettings
from planner.schedules.registry import schedule_name
from planner.units import parse_bytes, parse_link_bandwidth, parse_ms

__all__ = ["parse_microbatches", "settings_from_options", "cluster_recompute", "cluster_settings_from_options"]


def parse_microbatches(text: str) -> int | None:
    """'auto' -> None (every divisor of the batch is searched); '8' -> 8."""
    value = text.strip().lower()
    if value == "auto":
        return None
    try:
        count = int(value)
    except ValueError:
        raise PplanError(f"--microbatches {text!r} is neither auto nor an integer",
                         "use --microbatches auto or e.g. 8") from None
    if count < 1:
        raise PplanError(f"--microbatches must be at least 1, got {count}", "use --microbatches auto or a count such as 8")
    return count


def cluster_recompute(text: str) -> str:
    """`--recompute` for the data x pipeline x tensor search, whose modes are none|full|auto
    ('all' is accepted as the single-pipeline search spells it)."""
    mode = text.strip().lower()
    return {"all": "full"}.get(mode, mode)


def settings_from_options(*, devices: int | None, memory: str | None, global_batch: int, microbatches: str = "auto",
                          schedule: str = "auto", recompute: str = "auto", optimizer: str = "adam",
                          bandwidth: str | None = None, latency: str | None = None,
                          cluster: str | os.PathLike | None = None, method: str = "auto",
                          time_limit: float | None = None) -> PartitionSettings:
    """PartitionSettings from the command's option values (sizes and times as text, names in any
    case; bandwidth and latency None: planner.limits' DEFAULT_BANDWIDTH and DEFAULT_LATENCY_MS); the
    checks that need the profile stay in planner.partition.api.validate_settings."""
    if cluster is None and devices is None:
        raise PplanError("--devices is required without --cluster", "e.g. --devices 4")
    loaded = load_cluster(cluster) if cluster is not None else None
    if loaded is not None:
        _refuse_what_the_cluster_sets(loaded, memory=memory, bandwidth=bandwidth, latency=latency)
    return PartitionSettings(
        n_devices=devices,
        memory_bytes=parse_bytes(memory, "--memory") if memory is not None else None,
        global_batch=global_batch,
        microbatches=parse_microbatches(microbatches),
        schedule=schedule.strip().lower(),
        recompute=recompute.strip().lower(),
        optimizer=optimizer.strip().lower(),
        bandwidth=parse_link_bandwidth(bandwidth, "--bandwidth") if bandwidth is not None else DEFAULT_BANDWIDTH,
        latency_ms=parse_ms(latency) if latency is not None else DEFAULT_LATENCY_MS,
        cluster=loaded,
        method=method.strip().lower(),
        time_limit=_ilp_time_limit(time_limit, method.strip().lower()),
    )


def _ilp_time_limit(time_limit: float | None, method: str) -> float:
    """The ILP's time limit (60 s when not given). It bounds only the ILP, which no method but ilp
    runs: given with another it would change nothing, so it is refused."""
    if time_limit is None:
        return DEFAULT_ILP_TIME_LIMIT
    check_time_limit(time_limit)
    if method != "ilp":
        raise PplanError(f"--time-limit {time_limit:g} bounds the ILP, which --method {method[:20]} does not run",
                         "add --method ilp, or leave --time-limit out")
    return time_limit


def _refuse_what_the_cluster_sets(cluster: Cluster, *, memory: str | None, bandwidth: str | None, latency: str | None) -> None:
    """--memory, --bandwidth and --latency are the cluster file's fallbacks (a device without
    memory; a pair of devices without a link when the file has no default_link): given where the
    file sets them all, they would be ignored, so they are refused (a run with --bandwidth 1MB/s once
    predicted the file's 46.2 ms unchanged)."""
    unread = []
    n = len(cluster.names)
    every_pair = cluster.graph.number_of_edges() == n * (n - 1) // 2  # a link of its own for each pair
    if memory is not None and all(cluster.graph.nodes[d]["memory_bytes"] is not None for d in cluster.names):
        unread.append(("--memory", "every device in it has its own memory"))
    if bandwidth is not None and (cluster.default_bandwidth is not None or every_pair):
        unread.append(("--bandwidth", "its default_link sets the bandwidth" if cluster.default_bandwidth is not None
                       else "it links every pair of devices"))
    if latency is not None and (cluster.default_latency_ms is not None or every_pair):  # a link without one: 0
        unread.append(("--latency", "its default_link sets the latency" if cluster.default_latency_ms is not None
                       else "it links every pair of devices"))
    if unread:
        names = [flag for flag, _ in unread]
        flags = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
        reasons = "; ".join(dict.fromkeys(why for _, why in unread))
        raise PplanError(f"{flags} would be ignored with --cluster {cluster.source}: {reasons}",
                         f"drop {flags}, or edit the cluster file (a device without memory takes --memory; a pair "
                         "of devices without a link, in a file without default_link, the link flags)")


def cluster_settings_from_options(*, nodes: int | None, hardware: str | os.PathLike | None, global_batch: int,
                                  gpus_per_node: int | None = None, parallel: str = "auto", zero: int | None = None,
                                  recompute: str = "auto", memory: str | None = None, schedule: str = "auto",
                                  microbatches: str = "auto", grad_sync: str = "after-step") -> ClusterSettings:
    """ClusterSettings from `pplan partition --nodes`'s option values: the hardware preset or file
    loaded, sizes parsed, the schedule and micro-batch count read as the one-pipeline search reads
    them; `zero` None when --zero is not given (--parallel's zero=, else 0); the layout, ZeRO,
    recompute and whether the schedule runs at that count are checked by the search itself
    (planner.partition.parallel_search.plan_parallel), so its library callers get the same messages."""
    if nodes is None or hardware is None:
        raise PplanError("--nodes and --hardware go together", "e.g. --nodes 8 --gpus-per-node 8 --hardware a100-80gb")
    return ClusterSettings(
        nodes=nodes,
        hardware=load_hardware(hardware),
        global_batch=global_batch,
        gpus_per_node=gpus_per_node,
        parallel=parallel.strip().lower(),
        zero=zero,
        recompute=cluster_recompute(recompute),
        memory_bytes=parse_bytes(memory, "--memory") if memory is not None else None,
        schedule="auto" if schedule.strip().lower() == "auto" else schedule_name(schedule, "--schedule"),
        microbatches=parse_microbatches(microbatches),
        grad_sync=checked_grad_sync(grad_sync.strip().lower()),
    )
