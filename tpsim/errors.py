"""Project errors.

Bad user input raises :class:`InputError` (a ``ValueError``) whose message names the field and the value,
for example ``tp=16 does not divide num_attention_heads=40``. The CLI prints it as one line and exits with
status 2. Infeasible plans inside a search are data (counted with a reason), not exceptions.
"""

from __future__ import annotations


class TpsimError(ValueError):
    """Base class of every error tpsim raises on purpose."""


class InputError(TpsimError):
    """Bad user input: a missing file, malformed data, a field out of range, shapes that do not divide."""


class PlanError(InputError):
    """A sharding plan that violates a constraint; the message names the constraint and the numbers."""


def require(condition: bool, message: str, exc: type[TpsimError] = InputError) -> None:
    """Raise ``exc(message)`` unless ``condition`` holds (for user input, not internal invariants)."""
    if not condition:
        raise exc(message)
