"""The protocol layer: what the notebooks share, above the engines.

Engines (``es``, ``grpo``, ``rollout``, ``substrate``, ``tasks``, ``tools``, ``molora``, ``population``,
``budget``, ``memory_model``, ``runs``, ``stats``) take engine-level configs and know no notebook. This
package holds every notebook's parameter class (``params``, ``molora_params``), the registry of the
suite's notebooks (``notebooks``) and the protocols several notebooks run: the profile's substrate
(``substrate_setup``), the warm-started agent and the ES arm (``es_arm``), the GRPO arm (``grpo_arm``),
the fixed-budget protocol (``fixed_budget``), numbers read from training histories (``histories``), the
ablations (``ablations``), test decoding and greedy rescoring (``decoding``), the paper's tables (``tables``), figures
(``plots``) and paper B's substrate and factorial (``molora_cells``, ``factorial``). Notebooks sit on
top; ``tests/test_layering.py`` keeps the arrows pointing down.
"""
