"""Measurements with torch.distributed on the machine tpsim runs on (imports torch; only ``tpsim
bench-collectives`` and the validation use it)."""
