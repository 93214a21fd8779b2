"""The planner: stage cuts, micro-batch count, recompute and schedule under memory limits.

Pure solvers over arrays (problem, dp, ilp, brute, baselines, recompute), the bridge from a
profile and devices to a problem (build), the outer search over schedules and micro-batch
counts judged by the simulator (search, api), the infeasibility diagnosis (diagnose), the
report (summary) and what `pplan partition` computes from a profile file (job).
docs/planner.md describes the objective and formulations.
"""

from planner.partition.api import PartitionResult, partition
from planner.partition.baselines import BASELINES, balanced_cuts, baseline_cuts, uniform_cuts
from planner.partition.brute import solve_brute
from planner.partition.dp import min_memory_scale, solve_dp
from planner.partition.ilp import solve_ilp
from planner.partition.job import ClusterJob, ClusterSettings, PipelineJob, partition_cluster, partition_pipeline
from planner.partition.problem import PartitionProblem, Solution
from planner.partition.search import METHODS, PartitionSettings
from planner.partition.summary import summary_dict, summary_text

__all__ = [
    "BASELINES", "METHODS", "ClusterJob", "ClusterSettings", "PartitionProblem", "PartitionResult",
    "PartitionSettings", "PipelineJob", "Solution", "balanced_cuts", "baseline_cuts", "min_memory_scale",
    "partition", "partition_cluster", "partition_pipeline", "solve_brute", "solve_dp", "solve_ilp",
    "summary_dict", "summary_text", "uniform_cuts",
]
