"""`--parallel` refuses a degree given twice: the last one used to win silently
(`dp=2,pp=1,tp=8,pp=1`), and `dp=1,pp=2,tp=8,dp=2` was restated as another layout than typed."""

from __future__ import annotations

import pytest

from planner.errors import PplanError
from planner.parallel import parse_parallel


@pytest.mark.parametrize(("text", "key", "values"), [
    ("dp=2,pp=1,tp=8,pp=1", "pp", "pp=1 and pp=1"),
    ("dp=1,pp=2,tp=8,dp=2", "dp", "dp=1 and dp=2"),
    ("tp=2, tp =4", "tp", "tp=2 and tp=4"),
    ("dp=2,zero=1,zero=2", "zero", "zero=1 and zero=2"),
])
def test_a_repeated_key_is_refused_naming_both(text, key, values):
    with pytest.raises(PplanError, match=rf"^--parallel '{text}' gives {key} twice \({values}\); give each of dp, pp, tp, "
                                         r"zero once"):
        parse_parallel(text)


def test_each_key_once_in_any_order_still_parses():
    cfg = parse_parallel("tp=8, pp=2,dp=1,zero=1")
    assert (cfg.dp, cfg.pp, cfg.tp, cfg.zero) == (1, 2, 8, 1)


def test_the_cli_refuses_it_with_exit_code_2(pplan, analytic_profile, tmp_path):
    prof = analytic_profile("gpt:layers=4,hidden=64,heads=4,seq=32,vocab=512", "1,2")
    code, out, err = pplan("partition", prof, "--nodes", 1, "--hardware", "a100-80gb", "--global-batch", 8,
                           "--parallel", "dp=1,pp=2,tp=8,dp=2", "--out", tmp_path / "p.json")
    assert code == 2, (out, err)
    assert "gives dp twice (dp=1 and dp=2)" in err and "Traceback" not in err
    assert not (tmp_path / "p.json").exists()
