"""Simulation internals: the event engine, the result type and timeline files.

The public API is `planner.simulate` (simulate, simulate_costs, SimResult).
"""

from planner.simulation.engine import simulate_costs
from planner.simulation.result import TIMELINE_COLUMNS, SimResult, TimelineRow

__all__ = ["TIMELINE_COLUMNS", "SimResult", "TimelineRow", "simulate_costs"]
