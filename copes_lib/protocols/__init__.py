"""The protocol layer: what the notebooks share, above the engines, arranged by the part of the suite it serves.

Engines (``es``, ``grpo``, ``rollout``, ``substrate``, ``tasks``, ``tools``, ``molora``, ``population``,
``budget``, ``memory_model``, ``runs``, ``stats``) take engine-level configs and know no notebook. Here:

- the notebooks' shared plumbing, at the top: every notebook's parameter class (``params``), the registry of the
  suite's notebooks (``notebooks``), numbers read from training histories (``histories``), the paper's tables
  (``tables``) and figures (``plots``);
- ``testbed``: the checks before any experiment (notebook 01 and ``make preflight`` / ``make bases``): the
  profile's substrate (``substrate_setup``), the preflight and its record (``preflight``, ``preflight_cli``), the
  pre-run seed check (``prerun_seed_check``), the base gate (``base_gate``), the bases' digests and their shipping
  (``base_digest``, ``shipped_bases``);
- ``paper_a``: paper A's arms and comparisons (``PART=paper-a`` and ``norm-curve``, notebooks 02-08): the
  warm-started agent and the ES arm (``es_arm``), the GRPO arm (``grpo_arm``), the fixed-budget protocol
  (``fixed_budget``), the ablations (``ablations``), the norm curve (``norm_curve``), sweeps (``sweeps``), test
  decoding and greedy rescoring (``decoding``), the memory accounting (``memory_accounting``);
- ``paper_b``: paper B's cells (``PART=paper-b``, notebooks 10-13): their parameters (``molora_params``), the
  substrate's cells (``molora_cells``), the factorial (``factorial``), the sandbox study (``sandbox_study``);
- ``study``: notebook 09's scale study (``PART=study``).

Notebooks sit on top; ``tests/test_layering.py`` keeps the arrows pointing down.
"""
