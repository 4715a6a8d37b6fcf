"""Traced-model validation (``tpsim validate --model X.ops.json``): :mod:`.run` the launcher side (torch-free),
:mod:`.worker` the rank side."""
