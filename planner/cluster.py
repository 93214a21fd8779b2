"""A heterogeneous cluster as a networkx graph, and the order of devices along the pipeline.

File format (JSON, `pplan-cluster/1`; examples/cluster.json):

    {"format": "pplan-cluster/1",
     "devices": [{"name": "a100-0", "memory": "40GiB", "speed": 1.0}, ...],
     "default_link": {"bandwidth": "25GB/s", "latency": "0.01ms"},
     "links": [{"a": "a100-0", "b": "a100-1", "bandwidth": "300GB/s", "latency": "0.005ms"}, ...]}

Nodes carry memory_bytes (None = take --memory) and speed (relative compute speed: profile
times are divided by it); edges carry bandwidth (bytes/s) and latency (ms). A pair without a
link uses default_link (or --bandwidth/--latency when the file has none). Sizes accept the
units of planner.units (40GiB, 300GB/s, 5us) or plain numbers (bytes, bytes/s, ms); a link's
bandwidth is at least planner.limits.MIN_LINK_BANDWIDTH, so a plain 300 meant as 300 GB/s is refused. An optional
"description" holds free text for people. Any other key, at any level, is refused with the
nearest known one (`devices[0]: unknown key 'memroy'; did you mean 'memory'?`).

Pipeline order: consecutive stages talk over the link between their devices, so the devices
are ordered along a Hamiltonian path minimising the slowest hop's transfer time, then the sum
(exact Held-Karp over subsets up to EXACT_MAX devices, nearest-neighbour + 2-opt above:
planner.cost.device_path). The heuristic is O(n^2 log n) but for one part: 2-opt reversals whose
sum() differs from the path's only by rounding are summed again, O(n) each, and clusters that are
uniform but for fast links between scattered pairs of devices have O(n^2) of them a sweep. So at most
MAX_ORDER_DEVICES are ordered (measured 2026-12-03 on a 2-core VM: 8-GPU nodes 0.34 s at 1,024
devices, 1.2 s at 2,048, 4.3 s at 4,000; fast links pairing a random 30% of the devices 1.8 s at 1,024,
13 s at 2,048, 128 s at 4,000, two 2-opt sweeps each: a sweep more per improving one, 20 at most).

Which kind of device (speed, memory) holds each pipeline position matters as much, so
pipeline_orders also tries sequences of kinds: all distinct ones when there are at most
MAX_KIND_ORDERS (identical devices are never swapped among themselves), else the kinds sorted by
speed up and down and by memory down and up, then their swaps of two positions (MAX_SWAP_ORDERS in
all; on 5-device clusters of 5 kinds these came within 0-4% of all 120, at a fifth of the time).
On uniform links a sequence takes each kind's devices in name order; otherwise (up to EXACT_MAX
devices) it is laid along the best link path holding it, next to the best path both ways; above
EXACT_MAX the orders are the best path both ways, most-memory-first and the path stably sorted by
kind. The search runs on devices in a canonical order (kind, then name), so the orders tried, and
so the plan, do not depend on the order the file lists the devices in.
"""

from __future__ import annotations

import itertools
import math
import operator
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from planner.errors import ClusterError, PplanError
from planner.cost.comm import link_between, link_ms
from planner.cost.device_path import heuristic_path
from planner.jsonio import check_keys, read_json_file
from planner.limits import MAX_BANDWIDTH, MAX_MEMORY_BYTES, MAX_LATENCY_MS, MAX_SPEED, MIN_SPEED
from planner.jsontypes import short
from planner.plan import Device, Links
from planner.plan.bounds import MAX_LINK_PAIRS, MAX_PIPELINE_STAGES
from planner.textsafe import check_name
from planner.units import parse_bytes, parse_link_bandwidth, parse_ms

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["FORMAT", "EXACT_MAX", "MAX_ORDER_DEVICES", "MAX_CLUSTER_BYTES", "CLUSTER_KEYS", "Cluster", "load_cluster", "cluster_from_dict", "best_path", "exact_path",
           "path_score", "pipeline_orders"]

FORMAT = "pplan-cluster/1"
EXACT_MAX = 10  # Held-Karp is O(2^n n^2): 10 devices take ~0.1 s in Python
MAX_ORDER_DEVICES = 2_048  # devices best_path orders at most: its worst case grows as n^3 (module docstring)
MAX_KIND_ORDERS = 60  # pipeline_orders tries every arrangement of device kinds up to this many (module docstring)
MAX_SWAP_ORDERS = 24  # above it: the sorted kind orders and their swaps, at most this many
MAX_CLUSTER_BYTES = 8 * 2**20
"""Largest cluster file read: 4,000 devices (what a pipeline can have) in 8-GPU nodes with every link
inside a node listed (14,000 links), one per line as in examples/cluster.json, measured 1.6 MB and loads
in 1.2 s (2026-12-03); 8 MiB leaves room and bounds what parsing a hostile file costs."""
# Largest value of each field an integer too large for a float is refused against (Python callers:
# a file's integers have at most 40 digits, planner.jsonio).
_LARGEST = {"memory": f"{MAX_MEMORY_BYTES:g} bytes", "bandwidth": f"{MAX_BANDWIDTH:g} bytes/s", "latency": f"{MAX_LATENCY_MS:g} ms"}
# Every key a cluster file may hold, per object level; anything else is refused with the nearest one.
CLUSTER_KEYS = ("format", "description", "devices", "default_link", "links")  # description: free text for people
DEVICE_KEYS = ("name", "memory", "speed")
DEFAULT_LINK_KEYS = ("bandwidth", "latency")
LINK_KEYS = ("a", "b", "bandwidth", "latency")


@dataclass(frozen=True)
class Cluster:
    """Devices (nodes, in file order) and explicit links (edges) of a cluster."""

    graph: nx.Graph
    """Nodes: device name -> {index, memory_bytes, speed}; edges: {bandwidth, latency}."""
    default_bandwidth: float | None
    """Bytes/s of pairs without a link (None: the command line's --bandwidth)."""
    default_latency_ms: float | None
    """Latency of pairs without a link, ms (None: the command line's --latency)."""
    source: str = "<cluster>"
    """Where it was read from."""

    @property
    def names(self) -> list[str]:
        return sorted(self.graph.nodes, key=lambda n: self.graph.nodes[n]["index"])

    def devices(self, default_memory: int | None) -> tuple[Device, ...]:
        """Plan devices in file order; a device without memory gets `default_memory`."""
        out = []
        for n in self.names:
            attrs = self.graph.nodes[n]
            mem = attrs["memory_bytes"] if attrs["memory_bytes"] is not None else default_memory
            out.append(Device(name=n, memory_bytes=mem, speed=attrs["speed"]))
        return tuple(out)

    def links(self, bandwidth: float, latency_ms: float) -> Links:
        """Plan links: the default (file's, else the given) plus one override per edge."""
        index = {n: self.graph.nodes[n]["index"] for n in self.graph.nodes}
        pairs = sorted(
            (min(index[a], index[b]), max(index[a], index[b]), float(d["bandwidth"]), float(d["latency"]))
            for a, b, d in self.graph.edges(data=True)
        )
        return Links(
            bandwidth_bytes_per_s=self.default_bandwidth if self.default_bandwidth is not None else bandwidth,
            latency_ms=self.default_latency_ms if self.default_latency_ms is not None else latency_ms,
            pairs=tuple(pairs),
        )


def load_cluster(path: str | os.PathLike) -> Cluster:
    """Read and validate a cluster JSON file (ClusterError names the problem)."""
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        raise ClusterError(f"cluster file {str(p)!r} does not exist", "see examples/cluster.json for the format")
    data = read_json_file(p, "cluster file", ClusterError, max_bytes=MAX_CLUSTER_BYTES)
    return cluster_from_dict(data, source=str(p))


def _value(d: dict, key: str, parse, where: str, required: bool = True) -> Any:
    if key not in d or d[key] is None:
        if required:
            raise ClusterError(f"{where} is missing {key!r}")
        return None
    raw = d[key]
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise ClusterError(f"{where}.{key} must be a number or a string like 40GiB, got {raw!r}"[:200])
    try:
        return parse(raw)
    except PplanError as e:
        raise ClusterError(f"{where}.{key}: {e.message}", e.hint) from None
    except OverflowError:  # an integer too large for a float (only from Python callers: JSON caps digits)
        raise ClusterError(f"{where}.{key} is out of range: an integer of {len(str(abs(raw))):,} digits, "
                           f"the most is {_LARGEST[key]}") from None


def cluster_from_dict(data: Any, source: str = "<cluster>") -> Cluster:
    """Build a Cluster from parsed JSON (see module docstring)."""
    if not isinstance(data, dict):
        raise ClusterError(f"{source}: a cluster must be a JSON object with 'devices'")
    if data.get("format", FORMAT) != FORMAT:
        raise ClusterError(f"{source}: format {str(data.get('format'))[:60]!r} is not supported (this pplan reads {FORMAT})")
    check_keys(data, CLUSTER_KEYS, f"{source}: cluster", ClusterError)
    if not isinstance(data.get("description", ""), str):
        raise ClusterError(f"{source}: 'description' must be a string (free text for people)")
    devices = data.get("devices")
    if not isinstance(devices, list) or not devices:
        raise ClusterError(f"{source}: 'devices' must be a non-empty list", "see examples/cluster.json")
    most = min(MAX_PIPELINE_STAGES, MAX_ORDER_DEVICES)  # a cluster's devices are ordered along its pipeline
    if len(devices) > most:  # counted before any device is read
        raise ClusterError(f"{source}: 'devices' lists {len(devices):,} devices, more than a pipeline pplan orders can have "
                           f"({most:,})", "list the devices one pipeline runs on")
    links = data.get("links", [])
    if not isinstance(links, list):
        raise ClusterError(f"{source}: 'links' must be a list")
    # a link given twice, or to its own end, is refused where it stands: at most one per pair is read
    if len(links) > MAX_LINK_PAIRS:
        raise ClusterError(f"{source}: 'links' lists {len(links):,} links, more than {MAX_LINK_PAIRS:,}",
                           "give each pair of devices one link at most: pairs without one use default_link")
    import networkx as nx  # here, not at the top: every command and rank imports this module, few read a cluster file

    g = nx.Graph()
    for i, dv in enumerate(devices):
        _add_device(g, dv, f"{source}: devices[{i}]", i)
    default = data.get("default_link")
    if not isinstance(default, (dict, type(None))):
        raise ClusterError(f"{source}: 'default_link' must be an object with bandwidth and latency")
    default = default or {}
    check_keys(default, DEFAULT_LINK_KEYS, f"{source}: default_link", ClusterError)
    d_bw = _value(default, "bandwidth", parse_link_bandwidth, f"{source}: default_link", required=False)
    d_lat = _value(default, "latency", parse_ms, f"{source}: default_link", required=False)
    for j, ln in enumerate(links):
        _add_link(g, ln, f"{source}: links[{j}]", d_bw, d_lat)
    return Cluster(graph=g, default_bandwidth=d_bw, default_latency_ms=d_lat, source=source)


def _add_device(g: nx.Graph, dv: Any, where: str, index: int) -> None:
    """Device `dv` of the file (at `where`) as node `index` of `g`: a unique name a terminal can show,
    memory and speed in range."""
    if not isinstance(dv, dict):
        raise ClusterError(f"{where} must be an object with name, memory, speed")
    check_keys(dv, DEVICE_KEYS, where, ClusterError)
    name = dv.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ClusterError(f"{where} needs a non-empty string 'name'")
    check_name(name, "device name", ClusterError, where)  # printed in plans, tables and errors
    if name in g:
        raise ClusterError(f"{where}: device name {name!r} appears twice")
    memory = _value(dv, "memory", lambda v: parse_bytes(v, "memory"), where, required=False)
    speed = dv.get("speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not MIN_SPEED <= speed <= MAX_SPEED:
        raise ClusterError(f"{where}.speed must be a positive number (relative compute speed, {MIN_SPEED:g} to {MAX_SPEED:g}), "
                           f"got {speed!r}"[:200])
    g.add_node(name, index=index, memory_bytes=memory, speed=float(speed))


def _add_link(g: nx.Graph, ln: Any, where: str, d_bw: float | None, d_lat: float | None) -> None:
    """Link `ln` of the file (at `where`) as an edge of `g` between two of its devices, given once."""
    if not isinstance(ln, dict):
        raise ClusterError(f"{where} must be an object with a, b, bandwidth, latency")
    check_keys(ln, LINK_KEYS, where, ClusterError)
    a, b = ln.get("a"), ln.get("b")
    for end in (a, b):
        if not isinstance(end, str) or end not in g:
            known = ", ".join(sorted(map(str, g.nodes)))[:200]
            raise ClusterError(f"{where} names unknown device {short(end)}", f"devices are: {known}")
    if a == b:
        raise ClusterError(f"{where} links device {a!r} to itself")
    if g.has_edge(a, b):
        raise ClusterError(f"{where}: the link {a!r}-{b!r} is given twice")
    bw = _value(ln, "bandwidth", parse_link_bandwidth, where, required=d_bw is None)
    lat = _value(ln, "latency", parse_ms, where, required=False)
    g.add_edge(a, b, bandwidth=bw if bw is not None else d_bw, latency=lat if lat is not None else (d_lat if d_lat is not None else 0.0))


# ---- pipeline order -----------------------------------------------------------------------------

def _hop_costs(links: Links, n: int, nbytes: float) -> list[list[float]]:
    return [[0.0 if a == b else link_ms(max(nbytes, 1.0), link_between(links, a, b)) for b in range(n)] for a in range(n)]


def best_path(links: Links, n: int, nbytes: float) -> tuple[int, ...]:
    """Order of devices 0..n-1 minimising (slowest hop, total) for messages of `nbytes`."""
    _check_order_size(n)
    if n <= 2:
        return tuple(range(n))
    if n <= EXACT_MAX:
        return exact_path(_hop_costs(links, n, nbytes))
    return _canonical(heuristic_path(links, n, nbytes))


def exact_path(cost: list[list[float]]) -> tuple[int, ...]:
    """The order minimising (slowest hop, total) over hop cost matrix `cost`, exactly (Held-Karp;
    O(2^n n^2), so for at most EXACT_MAX devices)."""
    n = len(cost)
    full = (1 << n) - 1
    # pass 1: least bottleneck over Hamiltonian paths (min-max has optimal substructure)
    bottleneck, _ = _subset_paths(cost, max, float("inf"))
    # pass 2: least total using hops no slower than the bottleneck
    total, back = _subset_paths(cost, operator.add, min(bottleneck[full]))
    end = min(range(n), key=lambda v: (total[full][v], v))
    path, mask = [end], full
    while back[mask][path[-1]] >= 0:
        prev = back[mask][path[-1]]
        mask ^= 1 << path[-1]
        path.append(prev)
    path.reverse()
    return _canonical(tuple(path))


def _subset_paths(cost: list[list[float]], extend: Callable[[float, float], float],
                  max_hop: float) -> tuple[list[list[float]], list[list[int]]]:
    """Held-Karp over subsets: best[mask][v] is the least score of a path visiting the devices in
    `mask` and ending at v, a path's score folding its hops with `extend` (max: slowest hop, add:
    total), using only hops of cost at most `max_hop`; back[mask][v] is the device before v on it."""
    n = len(cost)
    full = (1 << n) - 1
    inf = float("inf")
    best = [[inf] * n for _ in range(1 << n)]
    back = [[-1] * n for _ in range(1 << n)]
    for v in range(n):
        best[1 << v][v] = 0.0
    for mask in range(1, full + 1):
        row = best[mask]
        for v in range(n):
            cur = row[v]
            if cur == inf:
                continue
            hops = cost[v]
            for u in range(n):
                if mask >> u & 1 or hops[u] > max_hop:
                    continue
                val = extend(cur, hops[u])
                m2 = mask | 1 << u
                if val < best[m2][u]:
                    best[m2][u] = val
                    back[m2][u] = v
    return best, back


def path_score(cost: list[list[float]], path: list[int] | tuple[int, ...]) -> tuple[float, float]:
    """(slowest hop, total) of visiting `path` in order: what best_path minimises, in that order."""
    hops = [cost[a][b] for a, b in zip(path, path[1:])]
    return (max(hops, default=0.0), sum(hops))


def _canonical(path: tuple[int, ...]) -> tuple[int, ...]:
    """A path and its reverse cost the same: return the one starting at the lower index."""
    return path if path[0] <= path[-1] else tuple(reversed(path))


def pipeline_orders(devices: tuple[Device, ...], links: Links, nbytes: float) -> list[tuple[int, ...]]:
    """Device orders worth trying, the same for any listing of the same devices (module docstring)."""
    n = len(devices)
    _check_order_size(n)
    kinds = [(d.speed, math.inf if d.memory_bytes is None else float(d.memory_bytes)) for d in devices]
    canon = sorted(range(n), key=lambda i: (kinds[i], devices[i].name, i))  # canonical position -> listed index
    kind_ids = sorted(set(kinds))
    kd = [kind_ids.index(kinds[i]) for i in canon]  # kind of each canonical device: non-decreasing
    orders: list[tuple[int, ...]] = []
    if _uniform(links, n):
        for seq in _kind_sequences(kd, kind_ids):  # a kind's devices, consecutive in canonical order, in that order
            take = {k: itertools.count(kd.index(k)) for k in set(seq)}
            orders.append(tuple(next(take[k]) for k in seq))
    else:
        pos = {dev: c for c, dev in enumerate(canon)}
        links = Links(links.bandwidth_bytes_per_s, links.latency_ms, tuple((pos[a], pos[b], bw, lat) for a, b, bw, lat in links.pairs))
        path = best_path(links, n, nbytes)
        orders += [path, path[::-1]]
        if n <= EXACT_MAX:  # each other sequence of kinds along its best path
            cost, have = _hop_costs(links, n, nbytes), {tuple(kd[c] for c in o) for o in orders}
            orders += [_kind_path(cost, kd, seq) for seq in _kind_sequences(kd, kind_ids) if seq not in have]
        else:  # most memory first, and the path's devices stably sorted by kind (a kind's devices stay in path order)
            orders.append(tuple(sorted(range(n), key=lambda c: (-kind_ids[kd[c]][1], -kd[c], c))))
            orders += [tuple(sorted(path, key=key)) for key in (kd.__getitem__, lambda c: -kd[c])]
    return list(dict.fromkeys(tuple(canon[c] for c in order) for order in orders))


def _check_order_size(n: int) -> None:
    if n > MAX_ORDER_DEVICES:
        raise ClusterError(f"{n:,} devices to order along the pipeline, more than the ordering handles ({MAX_ORDER_DEVICES:,})",
                           f"plan a pipeline of at most {MAX_ORDER_DEVICES:,} devices: list the devices one pipeline runs on")


def _uniform(links: Links, n: int) -> bool:
    """Whether every pair of the n devices has the same link (bandwidth and latency)."""
    listed = {(min(a, b), max(a, b)) for a, b, _, _ in links.pairs if a != b}
    seen = {links.between(a, b) for a, b in listed}
    if len(listed) < n * (n - 1) // 2:
        seen.add((links.bandwidth_bytes_per_s, links.latency_ms))
    return len(seen) <= 1


def _kind_sequences(kd: list[int], kind_ids: list[tuple[float, float]]) -> list[tuple[int, ...]]:
    """Every distinct arrangement of the kinds `kd` (lexicographic) when there are at most
    MAX_KIND_ORDERS, else the kinds by speed up and down and by memory down and up (kind ids sort
    by (speed, memory)), then their swaps of two positions, MAX_SWAP_ORDERS sequences in all."""
    n, counts = len(kd), [kd.count(k) for k in range(len(kind_ids))]
    if math.factorial(n) // math.prod(map(math.factorial, counts)) <= MAX_KIND_ORDERS:
        return list(_arrangements(counts, n))
    by_memory = tuple(sorted(kd, key=lambda k: (-kind_ids[k][1], -k)))
    out = dict.fromkeys((tuple(kd), tuple(kd[::-1]), by_memory, by_memory[::-1]))
    for base in list(out):
        for i, j in ((i, j) for i in range(n) for j in range(i + 1, n) if base[i] != base[j]):
            if len(out) >= MAX_SWAP_ORDERS:
                return list(out)
            out.setdefault(base[:i] + (base[j],) + base[i + 1:j] + (base[i],) + base[j + 1:])
    return list(out)


def _arrangements(counts: list[int], left: int):
    """The distinct sequences holding counts[k] copies of kind k, in lexicographic order."""
    if left == 0:
        yield ()
    for k, c in enumerate(counts):
        if c:
            counts[k] -= 1
            yield from ((k,) + rest for rest in _arrangements(counts, left - 1))
            counts[k] += 1


def _kind_path(cost: list[list[float]], kd: list[int], seq: tuple[int, ...]) -> tuple[int, ...]:
    """The order minimising (slowest hop, total) among those whose device at position p is of kind
    seq[p]: exact_path's two passes, each subset's size fixing its last device's position."""
    return _seq_paths(cost, kd, seq, operator.add, _seq_paths(cost, kd, seq, max, math.inf)[0])[1]


def _seq_paths(cost: list[list[float]], kd: list[int], seq: tuple[int, ...], extend: Callable[[float, float], float],
               max_hop: float) -> tuple[float, tuple[int, ...]]:
    """(least score, its path) over the paths following `seq` with hops of cost at most `max_hop`."""
    layer = {(1 << v, v): (0.0, (v,)) for v in range(len(cost)) if kd[v] == seq[0]}
    for k in seq[1:]:
        nxt: dict[tuple[int, int], tuple[float, tuple[int, ...]]] = {}
        for (mask, v), (cur, path) in sorted(layer.items()):
            for u in (u for u in range(len(cost)) if kd[u] == k and not mask >> u & 1 and cost[v][u] <= max_hop):
                val = extend(cur, cost[v][u])
                if val < nxt.get((mask | 1 << u, u), (math.inf,))[0]:
                    nxt[mask | 1 << u, u] = (val, path + (u,))
        layer = nxt
    return min(layer.values(), key=lambda x: (x[0], x[1][-1]))
