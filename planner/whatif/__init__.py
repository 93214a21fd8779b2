"""What-if questions about a plan: change its schedule, micro-batching or links, and sweep them.

`pplan simulate` and the report call this package; it sits above the simulator and below the figures (they
draw its rows), and imports neither torch nor matplotlib. Callers import from the package alone.

Modules: answer (find a plan's inputs, check the outputs to write, answer one question: `what_if`),
change (the `WhatIf` record and how it applies; micro-batching keeps the global batch),
sweep (one simulated row per micro-batch count or schedule, the report's grid, the sweep's JSON).
"""

from planner.whatif.answer import Setup, SimulationOutputs, WhatIfResult, load_setup, what_if
from planner.whatif.change import KEEP, WhatIf, apply_what_if
from planner.whatif.sweep import SweepRow, check_sweep_actions, parse_sweep, run_sweep, sweep_grid, sweep_to_dict

__all__ = ["KEEP", "WhatIf", "SimulationOutputs", "WhatIfResult", "SweepRow", "Setup", "what_if", "load_setup", "apply_what_if",
           "parse_sweep", "run_sweep", "check_sweep_actions", "sweep_grid", "sweep_to_dict"]
