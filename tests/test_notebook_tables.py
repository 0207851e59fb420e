"""The tables, figures and verdicts that notebooks 08, 09 and 13 build through copes_lib/protocols/ (moved out
of the notebooks, issue 35): what each returns on small inputs; the notebooks' smoke run covers the rest."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from copes_lib import memory_model, paper  # noqa: E402
from copes_lib.molora import sandbox as sb  # noqa: E402
from copes_lib.protocols import study as ss  # noqa: E402
from copes_lib.protocols.paper_a import memory_accounting as acc  # noqa: E402
from copes_lib.protocols.paper_b import sandbox_study as st  # noqa: E402


@pytest.fixture(scope="module")
def qwen35_lines():
    desc = memory_model.load_model_description("qwen35_4b")
    return (memory_model.paper_table_s7(desc, convention="paper"),
            memory_model.paper_table_s7(desc, convention="exact"))


def test_table_s7_frame_puts_ours_beside_the_papers(qwen35_lines):
    lines_paper, lines_exact = qwen35_lines
    table = acc.table_s7_frame(lines_paper, lines_exact).set_index("method")
    assert list(table.index) == list(memory_model.METHODS)
    for method in memory_model.METHODS:  # claim A9: our lines round to the paper's printed GiB at 128K
        assert round(table.loc[method, "ours @128K (paper units)"], 2) == paper.TABLE_S7[method]["at_128k_gib"]
    plt.close(acc.plot_memory_vs_context(lines_paper))


def test_table2_rules_and_the_beside_table_agree(qwen35_lines):
    lines_paper, _ = qwen35_lines
    matching = acc.table2_matching_rules(lines_paper)
    assert set(matching) <= set(memory_model.SHARDING_RULES)
    beside = acc.table2_beside_paper(lines_paper).set_index("method")
    for rule in memory_model.SHARDING_RULES:  # a matching rule reproduces the paper's Y / n for every method
        paper_marks = ["".join("Y" if paper.TABLE2_FITS_AT_128K[m][s] else "n" for s in memory_model.GPU_SETUPS)
                       for m in memory_model.METHODS]
        ours = [beside.loc[m, rule] for m in memory_model.METHODS]
        assert (ours == paper_marks) == (rule in matching), rule


def test_sandbox_verdict_names_what_failed():
    diffs = {r: {"mean": 0.01, "low": 0.005, "high": 0.02} for r in sb.REGIMES}
    helps = {r: False for r in sb.REGIMES} | {"random": True}
    verdict = st.claim_verdict({"holds": False, "helps": helps, "diffs": diffs}, "map sentence", 0.1, 3000)
    assert verdict.startswith("DOES NOT HOLD as stated at adapter noise 0.1 and 3000 function evaluations")
    assert "with pre-aligned adapters evolution does not beat gradient (evo - grad +0.0100 [+0.0050, +0.0200])" in verdict
    assert "in the random regime" in verdict and verdict.endswith("Over the map: map sentence.")
    holds = st.claim_verdict({"holds": True, "helps": helps, "diffs": diffs}, "m", 0.1, 3000)
    assert holds.startswith("HOLDS at adapter noise 0.1")


def test_sandbox_per_seed_scores_follow_the_seeds():
    grid = [{"regime": "prealigned", "optimiser": "gradient", "seed": s, "excess_loss": 0.1 * s} for s in (2, 0, 1)]
    assert st.per_seed(grid, "prealigned", "gradient") == ([[0.0], [0.1], [0.2]], [0, 1, 2])


def test_phase_diagram_marks_undefined_and_significant_cells():
    params = ss.ScaleStudyParams(PROFILE="smoke", MAP_PRIORS="0,0.1", MAP_POPULATIONS="20,40")
    tag = ss.map_tag("latent", 0.1, 40)
    keys = {f"map_copes_minus_es_{tag}": 0.05, f"map_copes_minus_es_low_{tag}": 0.01,
            f"map_copes_minus_es_high_{tag}": 0.09}
    from copes_lib.protocols.study.figures import _phase_grid

    ps, values, marks = _phase_grid(params, keys, "copes_minus_es", 100.0, "latent")
    assert ps == params.map_priors() and values.shape == (2, 2)
    assert marks[1, 1] == "5*" and marks[0, 0] == "n/a"  # interval above 0: starred; no key: undefined
    plt.close(ss.plot_phase_diagram(params, keys))
