"""The testbed's checks before any experiment: the preflight and its record, the pre-run seed check, the base gate, the bases' digests and their shipping, the substrate's parameters."""
