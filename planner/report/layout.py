"""Where each rank of a run sits among replicas, pipeline devices and tensor-parallel ranks, read
from the run JSON alone (the report may have no plan, and `pplan run` prints before any).

The run JSON records dp, and each rank's replica and pipeline device, but not tp: tp is what is
left of the process count, n_ranks = dp x devices x tp, and a rank's tensor-parallel index is
rank mod tp, as planner.execute.mesh numbers the ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.execute.runrecord import RunRecord
from planner.parallel import ParallelConfig

__all__ = ["RunLayout", "run_layout"]


@dataclass(frozen=True)
class RunLayout:
    """The (dp, pp, tp) degrees of a run."""

    dp: int
    """Data-parallel replicas."""
    pp: int
    """Pipeline devices of one replica."""
    tp: int
    """Tensor-parallel ranks per pipeline device."""

    @property
    def one_pipeline(self) -> bool:
        """No data or tensor parallelism: one process per pipeline device."""
        return self.dp == 1 and self.tp == 1

    def tp_rank(self, rank: int) -> int:
        """Tensor-parallel index of global rank `rank` (planner.execute.mesh.tp_index)."""
        return rank % self.tp

    def describe(self, zero: int = 0) -> str:
        """`dp=2,pp=2,tp=1` (`,zero=1` when sharded), as a plan's `parallel` is written in messages."""
        return ParallelConfig(dp=self.dp, pp=self.pp, tp=self.tp, zero=zero).describe()


def run_layout(run: RunRecord) -> RunLayout:
    """The run's layout. A count that does not divide (a record edited by hand) reads as tp = 1:
    the layout only labels ranks, and a wrong tensor-parallel index there would mislead."""
    pp = max(len({r.device for r in run.ranks}), 1)
    dp = max(run.dp, 1)
    tp, rest = divmod(run.n_ranks, dp * pp)
    return RunLayout(dp=dp, pp=pp, tp=tp if tp >= 1 and rest == 0 else 1)
