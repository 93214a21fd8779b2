"""RunOptions.check_resume, the rule preflight applies before any process starts: a resumed run warms
up again, so the steps it trains must outnumber --warmup, or a warm-up step would be timed (and its
memory read) as the run's steady step. Before, `--steps 8 --warmup 2` resumed at step 7 timed its one
cold step (114 ms against 72 ms steady) as the iteration time."""

from __future__ import annotations

import pytest

from planner.errors import PplanError
from planner.execute import RunOptions


@pytest.mark.parametrize("step, left, enough", [(7, 1, 10), (6, 2, 9)])
def test_a_resume_that_leaves_no_step_after_the_warmup_is_refused(step, left, enough):
    opts = RunOptions(steps=8, warmup=2)
    with pytest.raises(PplanError) as err:
        opts.check_resume(step, "ck/step-7")
    text = err.value.one_line()
    assert f"ck/step-7 is at step {step}: --steps 8 leaves {left} step(s) to train, none after --warmup 2" in text
    assert text.endswith(f"pass --steps {enough} or more")


def test_a_resume_with_a_step_after_the_warmup_is_accepted():
    RunOptions(steps=8, warmup=2).check_resume(5, "ck/step-5")
    RunOptions(steps=8, warmup=0).check_resume(7, "ck/step-7")  # no warm-up asked for: the one step is timed


def test_the_default_warmup_counts_too():
    # --warmup left out is 2 when --steps allows it; a resumed run needs 3 steps left for it
    with pytest.raises(PplanError, match="leaves 2 step"):
        RunOptions(steps=6).check_resume(4, "ck/step-4")


def test_a_save_at_or_past_the_step_count_is_refused():
    with pytest.raises(PplanError, match="already at step 4 >= --steps 4; pass --steps 8 to train further"):
        RunOptions(steps=4, warmup=0).check_resume(4, "ck/step-4")
