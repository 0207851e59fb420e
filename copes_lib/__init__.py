"""copes_lib: the library behind the CoPES / evolutionary mixture-of-LoRA reproducibility suite.

Bump ``__version__`` whenever a change alters numbers a notebook produces: it is part of every
cache key (see ``copes_lib.runs``), so a bump forces cached work to be recomputed.
"""

__version__ = "0.1.0"

# The CPU-kernel pin (copes_lib/threads.py) before any module of the library imports torch: a process started
# without it (papermill, a Jupyter kernel, a conda environment) gets it here, or says loudly why not.
from copes_lib import threads as _threads  # noqa: E402

_threads.apply_kernel_pin()
