"""copes_lib: the library behind the CoPES / evolutionary mixture-of-LoRA reproducibility suite.

Bump ``__version__`` whenever a change alters numbers a notebook produces: it is part of every
cache key (see ``copes_lib.runs``), so a bump forces cached work to be recomputed.
"""

__version__ = "0.1.0"
