"""A plan written into another folder than the one `pplan partition` ran in finds its profile from
any folder: the profile's relative path is recorded from the plan's folder. Before, it was recorded
as typed (from the working folder), and `pplan simulate /abs/sub/plan.json` run elsewhere failed
with "profile 'g.csv' does not exist"."""

import json
import shutil
from pathlib import Path

from planner.plan import load_plan, resolve_profile_path

ROOT = Path(__file__).resolve().parents[1]


def test_a_plan_in_a_subfolder_finds_its_profile_from_anywhere(pplan, tmp_path, monkeypatch):
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    (work / "sub").mkdir(parents=True)
    elsewhere.mkdir()
    shutil.copy(ROOT / "profiles" / "mlp.csv", work / "g.csv")
    monkeypatch.chdir(work)
    code, _, err = pplan("partition", "g.csv", "-n", 2, "--global-batch", 8, "-o", "sub/p.json")
    assert code == 0, err
    assert json.loads((work / "sub" / "p.json").read_text())["profile"]["path"] == "../g.csv"
    monkeypatch.chdir(elsewhere)
    code, out, err = pplan("simulate", work / "sub" / "p.json")
    assert code == 0, err
    assert f"profile {work / 'g.csv'};" in out


def test_a_plan_beside_its_profile_keeps_the_path_as_typed(pplan, tmp_path, monkeypatch):
    shutil.copy(ROOT / "profiles" / "mlp.csv", tmp_path / "g.csv")
    monkeypatch.chdir(tmp_path)
    code, _, err = pplan("partition", "g.csv", "-n", 2, "--global-batch", 8, "-o", "p.json")
    assert code == 0, err
    assert json.loads((tmp_path / "p.json").read_text())["profile"]["path"] == "g.csv"


def test_a_path_that_names_no_file_from_the_working_folder_is_read_from_the_plans(tmp_path, monkeypatch):
    """A plan built in Python (or by hand) for a profile beside it: written as it is, found beside it."""
    shutil.copy(ROOT / "tests" / "data" / "sim_plan.json", tmp_path / "plan.json")
    shutil.copy(ROOT / "tests" / "data" / "sim_profile.csv", tmp_path / "sim_profile.csv")
    data = json.loads((tmp_path / "plan.json").read_text())
    data["profile"] = {"path": "sim_profile.csv", "sha256": None}
    (tmp_path / "plan.json").write_text(json.dumps(data))
    monkeypatch.chdir(ROOT)
    plan = load_plan(tmp_path / "plan.json")
    assert resolve_profile_path(plan, tmp_path / "plan.json") == tmp_path / "sim_profile.csv"


def test_a_plan_written_through_a_linked_folder_finds_its_profile(pplan, tmp_path, monkeypatch):
    """'..' from a folder reached by a link climbs from where the link points: the path is recorded
    from the folders as they are on disk."""
    work, target = tmp_path / "work", tmp_path / "other" / "dir"
    work.mkdir()
    target.mkdir(parents=True)
    (work / "link").symlink_to(target)
    shutil.copy(ROOT / "profiles" / "mlp.csv", work / "g.csv")
    monkeypatch.chdir(work)
    code, _, err = pplan("partition", "g.csv", "-n", 2, "--global-batch", 8, "-o", "link/p.json")
    assert code == 0, err
    for folder, plan in ((work, "link/p.json"), (target, "p.json"), (tmp_path, target / "p.json")):
        monkeypatch.chdir(folder)
        code, _, err = pplan("simulate", plan)
        assert code == 0, (folder, err)


def test_a_missing_profile_is_named_where_it_was_looked_for(pplan, tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    shutil.copy(ROOT / "profiles" / "mlp.csv", tmp_path / "g.csv")
    monkeypatch.chdir(tmp_path)
    code, _, err = pplan("partition", "g.csv", "-n", 2, "--global-batch", 8, "-o", "sub/p.json")
    assert code == 0, err
    (tmp_path / "g.csv").unlink()
    code, out, err = pplan("simulate", "sub/p.json")
    assert code == 2 and out == ""
    assert err.strip() == ("pplan: error: the profile plan 'sub/p.json' names, '../g.csv', is not at 'sub/../g.csv' (a relative "
                           "path is read from the plan's folder, then the working folder); pass --profile PROFILE.csv, "
                           "or put the profile there")
