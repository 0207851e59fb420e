"""Paper A's arms and comparisons (notebooks 02-08): ES, CoPES and GRPO runs, the fixed budget, the ablations and the norm curve, decoding, the memory accounting."""
