"""Benchmarks anyone can rerun (`pplan bench`): planner speed, simulator speed, plan quality, fidelity.

Each bench returns a `Table` measured side by side in one run; `write_table` stores it as CSV
and Markdown headed by `machine_info()`. Importing this package imports neither torch nor
matplotlib; the measured benches import the executor when they run.
"""

from planner.bench.fidelity import DEFAULT_GRID, QUICK_GRID, FidelityPoint, bench_fidelity
from planner.bench.machine import machine_info
from planner.bench.planner_bench import bench_planner
from planner.bench.quality import bench_quality, bench_quality_measured
from planner.bench.simulator_bench import bench_simulator, parse_sizes
from planner.bench.table import Table, table_text, write_table

__all__ = [
    "DEFAULT_GRID",
    "QUICK_GRID",
    "FidelityPoint",
    "Table",
    "bench_fidelity",
    "bench_planner",
    "bench_quality",
    "bench_quality_measured",
    "bench_simulator",
    "machine_info",
    "parse_sizes",
    "table_text",
    "write_table",
]
