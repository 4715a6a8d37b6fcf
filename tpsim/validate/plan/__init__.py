"""Whole-plan validation cases: every axis of a plan on ``tp x pp x dp`` ranks, scaled down.

:mod:`.case` (torch-free) what runs, :mod:`.comm` every transfer expected, :mod:`.predict` the step predicted,
:mod:`.report` the comparison; rank side (torch): :mod:`.stack` the rank's chunks, :mod:`.run` what it measures."""
