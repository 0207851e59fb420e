"""Paper B's cells (notebooks 10-13): the MoLoRA parameters, the factorial, the sandbox study."""
