"""Reports for readers: claims, our numbers beside the paper's and the figures first; code hidden;
no progress bars, library warnings or numpy reprs in the HTML (the executed notebook keeps them)."""

import nbformat

from copes_lib import report, runs
from copes_lib.config import REPO_ROOT

TQDM_NOISE = ("/venv/tqdm/auto.py:21: TqdmWarning: IProgress not found. Please update jupyter and ipywidgets.\n"
              "  from .autonotebook import tqdm as notebook_tqdm\n")


def _executed_notebook(path):
    nb = nbformat.v4.new_notebook()
    code = nbformat.v4.new_code_cell("ratios = measure()\nprint(ratios)")
    code.outputs = [
        nbformat.v4.new_output("stream", name="stderr", text=TQDM_NOISE),
        nbformat.v4.new_output("stream", name="stderr", text="\rmemory:  33%|###       | 1/3 [00:01<00:02, 1.1s/it]"),
        nbformat.v4.new_output("stream", name="stderr",
                               text="x.py:7: FutureWarning: the default will change\n  frame.groupby(...)\n"),
        nbformat.v4.new_output("stream", name="stderr", text="x.py:9: CorruptCacheWarning: corrupted cache entry\n"),
        nbformat.v4.new_output("stream", name="stdout", text="{'ratio': np.float64(3.928), 'n': np.int64(4)}\n"),
        nbformat.v4.new_output("execute_result", data={"text/plain": "np.float64(0.0)"}, execution_count=1),
    ]
    nb.cells = [nbformat.v4.new_markdown_cell("# 08 — Memory\nProse of the notebook."), code]
    nbformat.write(nb, path)
    return path


def _store(tmp_path):
    results, figures = tmp_path / "results", tmp_path / "figures"
    runs.atomic_write_json(results / "smoke" / "08_memory_and_gpu_hours" / "summary.json", {
        "profile": "smoke", "notebook": "08_memory_and_gpu_hours", "git_sha": "abcdef1234567", "git_dirty": False,
        "qwen35_4b_es_gib_at_128k": 12.78, "qwen35_4b_full_grpo_gib_at_128k": 453.44,
        "qwen35_4b_lora_grpo_gib_at_128k": 402.55})
    (figures / "smoke").mkdir(parents=True)
    (figures / "smoke" / "08_memory_vs_context.png").write_bytes(b"\x89PNG")
    return results, figures


def test_notebook_html_opens_with_claims_numbers_and_figures(tmp_path):
    results, figures = _store(tmp_path)
    reports = tmp_path / "reports" / "smoke"
    reports.mkdir(parents=True)
    executed = _executed_notebook(reports / "08_memory_and_gpu_hours.ipynb")
    page = report.export_notebook_html(executed, reports / "08_memory_and_gpu_hours.html", "smoke",
                                       record={"status": "ok", "duration_s": 19.1}, results_root=results,
                                       figures_root=figures).read_text()
    header = page[page.index("<body"):page.index("Prose of the notebook")]
    assert "A9: Analytic memory at 128K context" in header and "12.78 / 453.44 / 402.55 GiB" in header
    assert "class='verdict agrees'" in header and "19.1 s" in header and "abcdef1234" in header
    assert 'src="../../figures/smoke/08_memory_vs_context.png"' in header.replace("'", '"')
    assert "Show code" in header and "body:not(.show-code) .jp-CodeCell .jp-Cell-inputWrapper" in page
    assert ">measure<" in page and ">ratios<" in page  # the code is there (highlighted), hidden by default
    for noise in ("TqdmWarning", "it/s]", "FutureWarning", "np.float64", "np.int64"):
        assert noise not in page, noise
    assert "CorruptCacheWarning" in page  # the suite's own warnings stay
    assert "{'ratio': 3.928, 'n': 4}" in page.replace("&#39;", "'")
    kept = nbformat.read(executed, as_version=4)  # the executed notebook keeps everything
    assert "TqdmWarning" in kept.cells[1].outputs[0]["text"]


def test_failed_run_says_its_numbers_are_the_previous_ones(tmp_path):
    results, figures = _store(tmp_path)
    header = report.reader_header("smoke", "08_memory_and_gpu_hours", {"status": "failed"}, results, figures,
                                  base=tmp_path)
    assert "did not finish" in header and "previous" in header


def test_index_shows_status_numbers_beside_the_paper_verdicts_and_thumbnails(tmp_path):
    results, figures = _store(tmp_path)
    reports = tmp_path / "reports" / "smoke"
    status = {"notebooks": {"08_memory_and_gpu_hours": {"status": "ok", "duration_s": 19.14}}}
    page = report.render_index("smoke", reports, status, results_root=results, figures_root=figures,
                               notebooks=["02_standard_es", "08_memory_and_gpu_hours"]).read_text()
    assert "19.1 s" in page and "12.78 / 453.44 / 402.55 GiB" in page and "verdict agrees" in page
    assert '<img src="../../figures/smoke/08_memory_vs_context.png"' in page
    assert "02_standard_es" in page and "not run" in page and "no results yet" in page


def test_headline_formats_numbers_for_reading():
    rows = report.headline({"val_accuracy_at_16": 0.4199, "best_val_accuracy": 0.5, "device_hours": 0.0553,
                            "chosen_sigma": 0.01}, "02_standard_es")
    by_label = {r["label"]: r for r in rows}
    assert by_label["standard ES, validation accuracy at step 16"]["ours"] == "41.99%"
    assert by_label["standard ES, validation accuracy at step 16"]["paper"] == "77.60%"
    # absent: "not measured" with why (issue 50: a dash or "None" told the reader nothing)
    assert by_label["base validation accuracy"]["ours"] == "not measured"
    assert by_label["base validation accuracy"]["reason"] == "02_standard_es did not record it (not in this run)"
    assert report.format_value(float(__import__("numpy").float64(0.25))) == "0.25"


def test_headline_keys_exist_in_the_committed_cpu_summaries():
    """A renamed summary key would silently show as a dash in every report: catch it here."""
    for stem, items in report.HEADLINES.items():
        summary = runs.load_summary("cpu", stem, root=REPO_ROOT / "results")  # the committed ones, not the session's
        if summary is None:
            continue  # not committed (yet)
        missing = [item.key for item in items if item.key not in summary]
        assert not missing, f"{stem}: {missing} not in results/cpu/{stem}/summary.json"


def test_an_empty_summary_is_named_in_the_index_and_the_report(tmp_path, capsys):
    results, figures = _store(tmp_path)
    bad = results / "smoke" / "05_fixed_budget_math" / "summary.json"
    bad.parent.mkdir(parents=True)
    bad.write_text("")
    reports = tmp_path / "reports" / "smoke"
    status = {"notebooks": {"05_fixed_budget_math": {"status": "ok"}, "08_memory_and_gpu_hours": {"status": "ok"}}}
    page = report.render_index("smoke", reports, status, results_root=results, figures_root=figures,
                               notebooks=["05_fixed_budget_math", "08_memory_and_gpu_hours"]).read_text()
    assert str(bad) in page and "ONLY=05" in page and "12.78 / 453.44 / 402.55 GiB" in page  # the others still show
    assert str(bad) in capsys.readouterr().err
    header = report.reader_header("smoke", "05_fixed_budget_math", {"status": "ok"}, results, figures, base=tmp_path)
    assert str(bad) in header


def test_the_reason_shows_beside_the_verdict(tmp_path):
    results, figures = _store(tmp_path)
    page = report.render_index("smoke", tmp_path / "reports" / "smoke", {"notebooks": {}}, results_root=results,
                               figures_root=figures, notebooks=["08_memory_and_gpu_hours"]).read_text()
    assert "class='reason'>3 of 3 figures round to the paper&#x27;s printed GiB" in page


def test_the_committed_cpu_results_render_as_an_index_of_ok_notebooks_with_working_links(tmp_path):
    """`python -m copes_lib.cli report --profile cpu` (make report) on a checkout with no run of its own:
    every notebook with committed results reads ok, from results/cpu/suite_run.json (or its own
    summary.json), and every link and image of the page resolves (no status.json that is not there)."""
    import re

    from copes_lib import cli
    from copes_lib.config import REPO_ROOT

    committed = sorted(p.parent.name for p in (REPO_ROOT / "results" / "cpu").glob("*/summary.json"))
    committed_roots = {"results_root": REPO_ROOT / "results", "figures_root": REPO_ROOT / "figures"}
    assert committed, "no committed results/cpu/*/summary.json"
    reports = tmp_path / "reports" / "cpu"
    page = cli.render_reports("cpu", reports_dir=reports, **committed_roots).read_text()
    rows = {re.match(r"(?:<a[^>]*>)?(\w+)", row).group(1): row for row in page.split("<tr><td><b>")[1:]}
    for stem in committed:
        status = re.search(r"<td class='(\w+)'>", rows[stem]).group(1)
        assert status == "ok", f"{stem} reads {status!r}"
        assert "suite_run.json" in rows[stem] or f"results/cpu/{stem}/summary.json" in rows[stem]
    suite_run = runs.read_json(REPO_ROOT / "results" / "cpu" / "suite_run.json")["notebooks"]
    assert all(f"{suite_run[s]['duration_s']:.1f} s" in rows[s] for s in committed if s in suite_run)
    assert "not run" not in page and f"{len(committed)} ok, 0 failed" in page
    links = re.findall(r"""(?:href|src)=["']([^"'#]+)["']""", page)
    assert len(links) > 2 * len(committed)  # summaries, figures, the suite run
    missing = [link for link in links if not (reports / link).resolve().exists()]
    assert not missing, f"links that resolve to nothing: {missing}"
    assert "status.json" not in links
    runs.atomic_write_json(reports / "status.json", {"notebooks": {}})  # a run of this checkout: linked
    assert 'href="status.json"' in cli.render_reports("cpu", reports_dir=reports, **committed_roots).read_text()
