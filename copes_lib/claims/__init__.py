"""The claims of both papers, judged against the suite's own results.

Each claim names the notebook whose ``summary.json`` it reads and a rule, fixed here before any result
exists, that turns our numbers into a verdict (:data:`VERDICTS`): ``agrees``, ``partly``, ``does not``,
``opposite`` (the data show the other direction, significantly), ``inconclusive`` (the study could not
tell: its interval is too wide, or a noise source is unmeasured), ``not in regime`` (paper A's method
claims, when notebook 01 says the substrate is not in the papers' regime) or ``missing`` (the notebook
has not written the keys; missing is never counted as agreement). Every verdict comes with its
``reason`` (why it is what it is), shown in ``claims.csv``, the README and the HTML reports.

Statistical claims compare two methods on the same problems with :mod:`copes_lib.stats`: per-seed
per-problem scores (``scores.npz`` beside the summary, written with ``stats.save_scores``), both noise
sources counted (training seeds and the evaluation set), Holm over the notebook's family of tests
(:data:`FAMILIES`), an equivalence test (TOST) against a margin declared in ``paper.py`` for "no effect"
readings, and the minimum detectable effect at 80% power in the row's ``power`` column. A data set is
tested once: a contrast whose two score arrays are byte-identical to an earlier notebook's contrast (06
reuses 05's K = 1 / K = 4 runs) takes that test, its margin and its Holm family, so two claims never
give two verdicts on the same arrays. Without per-problem scores a statistical claim is inconclusive:
the point estimates are shown, never judged.

Our models are ~1000x smaller than the papers', so paper A's effects are compared as a share of the
reference gain (full GRPO's best minus the base), see ``paper.EFFECT_SHARE_A``; paper B's effects are
in nats of log-perplexity (a perplexity ratio, the same unit at any model size), see
``paper.equivalence_margin_b``. No margin is ever derived from an effect we measured to be null.
``docs/statistics.md`` holds a copy of every rule generated from this module (:func:`rules_markdown`;
a test keeps them equal).

The package, by concept: :mod:`~copes_lib.claims.verdicts` (the verdicts, the Holm families and how a
test reads as a verdict), :mod:`~copes_lib.claims.paper_a` and :mod:`~copes_lib.claims.paper_b` (each
paper's claims and their rules), :mod:`~copes_lib.claims.predictions` (our own claims and registered
predictions: S1-S3, R1-R8, P1-P6, the mechanism rules, L4) and :mod:`~copes_lib.claims.table` (the claims
table over a profile's results, its markdown and the generated pages). Every public name is importable
from ``copes_lib.claims``.
"""

from copes_lib.claims.paper_a import A2_MIN_LONG_SEEDS, BENCHMARK_CLAIMS, PAPER_A_CLAIMS
from copes_lib.claims.paper_b import PAPER_B_CLAIMS
from copes_lib.claims.predictions import (
    LOWRANK_CLAIMS,
    LOWRANK_MARGIN,
    LOWRANK_PAIRS,
    MECH_MIN_FIT_POINTS,
    MECH_UPDATES,
    MECHANISM_CLAIMS,
    MOLORA_PREDICTION_CLAIMS,
    MOLORA_REGIME_KEY,
    OUR_CLAIMS,
    OURS,
    P_MOLORA_REGIME,
    REGIME_PREDICTION_CLAIMS,
    REGIME_PREDICTION_NOTEBOOKS,
    SCALE_CLAIMS,
    lowrank_reading,
    parse_rule,
)
from copes_lib.claims.table import (
    CLAIMS,
    README_END,
    README_START,
    RESULTS_PAGE,
    RULES_END,
    RULES_START,
    UnreadableResultError,
    judge_claims,
    load_summaries,
    readme_markdown,
    rules_markdown,
    significant_results,
    stale_notebooks,
    to_markdown,
    update_docs,
    update_readme,
    write_results_pages,
)
from copes_lib.claims.verdicts import (
    AGREES,
    CLAIM_TASK,
    CONTRAST_CLAIM,
    DETERMINISTIC,
    DISAGREES,
    FAMILIES,
    GATE_RULE,
    GATE_RULE_KEY,
    GATE_TASKS,
    INCONCLUSIVE,
    MISSING,
    NO_SCORES,
    NOT_ACTIONABLE,
    NOT_CHECKED,
    NOT_IN_REGIME,
    OPPOSITE,
    PARTLY,
    REGIME_CLAIMS,
    REGIME_KEY,
    REGIME_NOTEBOOK,
    REGION_MAP,
    SCORES,
    STALE,
    VERDICTS,
    WRITTEN,
    Claim,
    Context,
    Contrast,
    Families,
    Judgement,
    Shared,
    _stat,
    gate_task,
    gates_per_task,
    regime_key,
)

__all__ = [
    "A2_MIN_LONG_SEEDS", "AGREES", "CLAIM_TASK", "GATE_TASKS", "gate_task", "regime_key", "GATE_RULE", "GATE_RULE_KEY", "gates_per_task", "BENCHMARK_CLAIMS", "CLAIMS", "CONTRAST_CLAIM", "DETERMINISTIC", "DISAGREES",
    "FAMILIES", "INCONCLUSIVE", "LOWRANK_CLAIMS", "LOWRANK_MARGIN", "LOWRANK_PAIRS", "MECHANISM_CLAIMS",
    "MECH_MIN_FIT_POINTS", "MECH_UPDATES", "MISSING", "MOLORA_PREDICTION_CLAIMS", "MOLORA_REGIME_KEY", "NOT_ACTIONABLE", "NOT_CHECKED", "NOT_IN_REGIME",
    "NO_SCORES", "OPPOSITE", "OURS", "OUR_CLAIMS", "PAPER_A_CLAIMS", "PAPER_B_CLAIMS", "PARTLY", "P_MOLORA_REGIME",
    "README_END", "README_START", "REGIME_CLAIMS", "REGIME_KEY", "REGIME_NOTEBOOK", "REGIME_PREDICTION_CLAIMS",
    "REGIME_PREDICTION_NOTEBOOKS", "REGION_MAP", "RULES_END", "RULES_START", "SCALE_CLAIMS", "SCORES", "STALE",
    "VERDICTS", "WRITTEN", "Claim", "Context", "Contrast", "Families", "Judgement", "Shared", "UnreadableResultError",
    "_stat", "judge_claims", "load_summaries", "lowrank_reading", "parse_rule", "rules_markdown",
    "significant_results", "stale_notebooks", "to_markdown", "update_docs", "update_readme",
    "write_results_pages", "readme_markdown", "RESULTS_PAGE",
]
