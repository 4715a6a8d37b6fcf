"""Project errors.

Bad user input raises :class:`InputError` (a ``ValueError``) whose message names the field and the value,
for example ``tp=16 does not divide num_attention_heads=40``. The CLI prints it as one line and exits with
status 2. Infeasible plans inside a search are data (counted with a reason), not exceptions.
"""

from __future__ import annotations

from collections.abc import Iterable


class TpsimError(ValueError):
    """Base class of every error tpsim raises on purpose."""


class InputError(TpsimError):
    """Bad user input: a missing file, malformed data, a field out of range, shapes that do not divide."""


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread so that cleanup runs as for Ctrl-C; ``tpsim`` prints one
    line and exits with status 128 + the signal (raised by :mod:`tpsim.cli` and by launchers that stop their
    children first, :func:`tpsim.validate.launch._terminate_as_exception`)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class PlanError(InputError):
    """A sharding plan that violates a constraint; the message names the constraint and the numbers."""


def require(condition: bool, message: str, exc: type[TpsimError] = InputError) -> None:
    """Raise ``exc(message)`` unless ``condition`` holds (for user input, not internal invariants)."""
    if not condition:
        raise exc(message)


def did_you_mean(word: object, choices: object) -> str:
    """`` (did you mean 'llama3-70b'?)`` when ``word`` is close to one or more of ``choices`` (a typo: difflib's
    ratio >= 0.6, case and ``-``/``_``/``.`` ignored), else an empty string."""
    import difflib

    def key(text: str) -> str:
        return "".join(ch for ch in str(text).lower() if ch not in "-_. ")

    names = [str(c) for c in choices]  # type: ignore[attr-defined]
    keys = {key(n): n for n in names}
    close = difflib.get_close_matches(key(str(word)), list(keys), n=2, cutoff=0.6)
    return " (did you mean " + " or ".join(repr(keys[c]) for c in close) + "?)" if close else ""


def check_keys(data: object, allowed: Iterable[str], where: str, required: Iterable[str] = ()) -> None:
    """Unknown or missing keys of a mapping read from a file -> InputError naming the element (every loader's
    rule: cluster and topology files, stack profiles)."""
    from collections.abc import Mapping

    allowed = tuple(allowed)
    if not isinstance(data, Mapping):
        raise InputError(f"{where}: expected a mapping, got {data!r}")
    for key in data:
        if key not in allowed:
            raise InputError(f"{where}: unknown key {key!r} (allowed: {', '.join(allowed)})")
    for key in required:
        if key not in data:
            raise InputError(f"{where}: missing key {key!r}")
