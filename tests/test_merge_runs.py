"""`python -m copes_lib.cli merge-runs`: parts run in separate clones merged into one suite_run.json as the runner
merges its own (docs/running.md, "Parts run in separate clones")."""

import json

import pytest

from copes_lib import cli, runs
from copes_lib.config import ConfigError


def _part(sha, started, ended, notebooks):
    return {"git_sha": sha, "started": started, "ended": ended, "wall_s": 1.0,
            "notebooks": {stem: {"status": "ok", "duration_s": d} for stem, d in notebooks.items()}}


def _record(profile="cpu", **parts):
    return cli._with_notebooks({"parts": parts, "profile": profile})


A = _part("a" * 40, "2026-01-01T10:00", "2026-01-01T11:00", {"00_suite_overview": 1.0, "99_summary": 2.0})
B = _part("b" * 40, "2026-01-01T10:30", "2026-01-01T12:00", {"10_molora_substrate": 3.0, "99_summary": 4.0})


def test_the_union_of_the_parts_and_the_latest_run_of_each_notebook():
    merged = cli.merge_suite_runs(_record(**{"paper-a": A}), _record(**{"paper-b": B}))
    assert sorted(merged["parts"]) == ["paper-a", "paper-b"] and merged["profile"] == "cpu"
    assert merged["notebooks"]["99_summary"]["duration_s"] == 4.0  # paper-b ended later: its 99 row wins
    assert set(merged["notebooks"]) == {"00_suite_overview", "10_molora_substrate", "99_summary"}
    assert merged["started"] == "2026-01-01T10:00"
    # the same as the runner recording paper-b into paper-a's file
    assert merged == _record(**{"paper-a": A, "paper-b": B})


def test_a_part_in_both_keeps_the_run_that_ended_later():
    later = _part("c" * 40, "2026-01-02T10:00", "2026-01-02T11:00", {"00_suite_overview": 9.0})
    for ours, theirs in ((_record(**{"paper-a": A}), _record(**{"paper-a": later})),
                         (_record(**{"paper-a": later}), _record(**{"paper-a": A}))):
        merged = cli.merge_suite_runs(ours, theirs)
        assert merged["parts"]["paper-a"]["git_sha"] == "c" * 40
        assert merged["notebooks"] == {"00_suite_overview": {"status": "ok", "duration_s": 9.0}}


def test_an_older_complete_run_is_kept_under_its_own_rows():
    older = {"notebooks": {"09_scale_study": {"status": "ok", "duration_s": 7.0}}}
    ours = {**_record(**{"paper-a": A}), "before_parts": older}
    merged = cli.merge_suite_runs(_record(**{"paper-b": B}), cli._with_notebooks(ours))
    assert merged["before_parts"] == older and merged["notebooks"]["09_scale_study"]["duration_s"] == 7.0


@pytest.mark.parametrize("theirs,message", [
    (_record("smoke", **{"paper-b": B}), "profile 'smoke'"),
    ({"notebooks": {}}, "not a suite_run.json with parts"),
    ({**_record(**{"paper-b": B}), "before_parts": {"notebooks": {"x": {}}}}, None),  # two different older runs
])
def test_records_that_cannot_be_merged_are_refused_naming_the_source(theirs, message):
    ours = {**_record(**{"paper-a": A}), "before_parts": {"notebooks": {"y": {}}}}
    if message is None:  # two different older complete runs
        with pytest.raises(ConfigError, match="another older complete run"):
            cli.merge_suite_runs(ours, theirs, source="clone-b")
        return
    with pytest.raises(ConfigError, match=message) as info:
        cli.merge_suite_runs(ours, theirs, source="clone-b")
    assert "clone-b" in str(info.value)


def test_the_command_merges_a_clones_folder_and_a_file_and_names_a_wrong_path(tmp_path, capsys):
    results = tmp_path / "results"
    runs.atomic_write_json(results / "cpu" / "suite_run.json", _record(**{"paper-a": A}))
    clone = tmp_path / "clone-b"
    runs.atomic_write_json(clone / "results" / "cpu" / "suite_run.json", _record(**{"paper-b": B}))
    study = _part("d" * 40, "2026-01-01T09:00", "2026-01-01T09:30", {"09_scale_study": 5.0})
    runs.atomic_write_json(tmp_path / "study.json", _record(study=study))
    assert cli.merge_runs("cpu", [str(clone), str(tmp_path / "study.json")], results_root=results) == 0
    merged = json.loads((results / "cpu" / "suite_run.json").read_text())
    assert sorted(merged["parts"]) == ["paper-a", "paper-b", "study"]
    assert "make reproduce PROFILE=cpu ONLY=99" in capsys.readouterr().out
    before = (results / "cpu" / "suite_run.json").read_text()
    with pytest.raises(ConfigError, match="'nowhere' is neither a suite_run.json nor a clone's folder"):
        cli.merge_runs("cpu", [str(clone), "nowhere"], results_root=results)
    assert (results / "cpu" / "suite_run.json").read_text() == before  # nothing written on an error
    with pytest.raises(ConfigError, match="does not exist"):
        cli.merge_runs("smoke", [str(clone)], results_root=results)


def test_the_cli_answers_a_wrong_source_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(runs, "RESULTS_ROOT", tmp_path)
    runs.atomic_write_json(tmp_path / "cpu" / "suite_run.json", _record(**{"paper-a": A}))
    assert cli.main(["merge-runs", "--profile", "cpu", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: sources:") and "\n" not in err


def test_a_run_of_the_profile_in_progress_here_is_not_written_under(tmp_path):
    runs.atomic_write_json(tmp_path / "cpu" / "suite_run.json", _record(**{"paper-a": A}))
    runs.atomic_write_json(tmp_path / "b.json", _record(**{"paper-b": B}))
    with cli.profile_lock("cpu", tmp_path):
        with pytest.raises(cli.SuiteBusyError, match="another run of the suite"):
            cli.merge_runs("cpu", [str(tmp_path / "b.json")], results_root=tmp_path)
    assert sorted(runs.read_json(tmp_path / "cpu" / "suite_run.json")["parts"]) == ["paper-a"]
