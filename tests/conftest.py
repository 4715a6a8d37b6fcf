"""Test-session setup.

Where the environment forbids bytecode (``PYTHONDONTWRITEBYTECODE``, as on the development machines), every
subprocess the suite starts (validation ranks, CLI runs, launchers) would compile tpsim from source again, and
pytest would rewrite every test module on every run. The suite keeps one bytecode cache outside the checkout
instead (``PYTHONPYCACHEPREFIX`` in a per-user temporary folder): nothing is written into the repository, and a
source change is picked up as usual (the cache is checked against each file's modification time and size)."""

from __future__ import annotations

import os
import sys
import tempfile

if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None or sys.dont_write_bytecode:
    prefix = os.environ.setdefault("PYTHONPYCACHEPREFIX",
                                   os.path.join(tempfile.gettempdir(), f"tpsim-pycache-{os.getuid()}"))
    sys.pycache_prefix = sys.pycache_prefix or prefix
    sys.dont_write_bytecode = False


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def shared_ranks(tmp_path_factory):
    """``shared_ranks(nproc)``: the results of the one launch of every case registered for ``nproc`` ranks
    (``tests/shared_launches.py``), launched when a test first asks for them."""
    import shared_launches

    def get(nproc: int) -> dict:
        return shared_launches.results(nproc, lambda: tmp_path_factory.mktemp(f"shared-{nproc}-ranks"))
    return get
