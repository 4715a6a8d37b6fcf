"""Design rules: layers import downwards only (every package, relative imports resolved); torch only in the
torch-side tools, matplotlib only inside the functions that draw; ``tpsim estimate`` and ``tpsim plan`` run
without torch or matplotlib in ``sys.modules``."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path


PKG = Path(__file__).resolve().parents[1] / "tpsim"

# low to high (ARCHITECTURE.md: dependency direction); a module may import its own layer and the ones before it
LAYERS = ["errors", "limits", "units", "io", "boundedjson", "cachefile", "parsecache", "safeyaml", "schema",
          "schemas", "procs", "calibration", "model", "hardware",
          "precision", "pipeline", "plan", "tp_plan", "comm_plan", "topology", "stacks", "collectives", "compute",
          "estimator", "opgraph", "train", "runs", "runfit", "search", "report", "launch", "design", "bench", "profiler",
          "validate", "trace", "work", "cli"]
TORCH_ALLOWED = ("validate", "profiler", "bench", "trace")
ENTRY_POINTS = ("__main__.py",)
"""``python -m tpsim.x`` entry points sit with the command line, above every layer."""


def _layer_of(path: Path) -> str:
    rel = path.relative_to(PKG)
    if rel.name in ENTRY_POINTS:
        return "cli"
    return rel.parts[0].removesuffix(".py")


@lru_cache(maxsize=None)
def _tree(path: Path) -> ast.Module:
    """The parsed file (each file parsed once for every rule of this module)."""
    return ast.parse(path.read_text())


def imported_modules(path: Path) -> set[str]:
    """Absolute names of the tpsim modules a file imports (anywhere in it), relative imports resolved against
    the file's package: ``from ..x import y`` in tpsim/a/b.py is tpsim.x (or tpsim.x.y), ``from . import z``
    is tpsim.a.z."""
    rel = path.relative_to(PKG.parent).with_suffix("")
    package = list(rel.parts[:-1])  # a module's package; for __init__ the package itself
    names: set[str] = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module.split(".") if node.module else []
            else:
                base = package[:len(package) - (node.level - 1)] + (node.module.split(".") if node.module else [])
            if node.module is None:  # from . import a, b: each name may be a module
                names |= {".".join(base + [a.name]) for a in node.names}
            else:
                names.add(".".join(base))
    return {n for n in names if n == "tpsim" or n.startswith("tpsim.")}


@lru_cache(maxsize=None)
def _target_layer(module: str) -> str | None:
    """The layer a tpsim module belongs to; None for the package root (``from .. import __version__``)."""
    parts = module.split(".")
    if len(parts) < 2 or not ((PKG / f"{parts[1]}.py").exists() or (PKG / parts[1]).is_dir()):
        return None
    return parts[1]


def test_relative_imports_are_resolved():
    core = imported_modules(PKG / "estimator" / "core.py")
    assert "tpsim.plan" in core and "tpsim.estimator.comm" in core  # from ..plan / from .comm
    cli = imported_modules(PKG / "cli" / "__init__.py")
    assert "tpsim.errors" in cli and "tpsim" in {m.rsplit(".", 1)[0] for m in cli if m.endswith("__version__")}
    init = imported_modules(PKG / "estimator" / "__init__.py")
    assert "tpsim.estimator.context" in init


def test_every_package_has_a_layer():
    packages = {p.name.removesuffix(".py") for p in PKG.iterdir()
                if (p.suffix == ".py" and p.name != "__init__.py") or (p.is_dir() and (p / "__init__.py").exists())}
    assert not packages - set(LAYERS), f"add {sorted(packages - set(LAYERS))} to LAYERS"


def test_import_direction():
    problems = []
    for path in sorted(PKG.rglob("*.py")):
        if path.parent == PKG and path.name == "__init__.py":
            continue  # the public API (tpsim.estimate, ...) sits on top of everything
        layer = _layer_of(path)
        for module in imported_modules(path):
            target = _target_layer(module)
            if target is not None and target != layer and LAYERS.index(target) > LAYERS.index(layer):
                problems.append(f"{path.relative_to(PKG)} ({layer}) imports {module} ({target})")
    assert not problems, "\n".join(problems)


def _module_level_imports(tree: ast.Module) -> list[str]:
    mods = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            mods += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            mods.append(node.module)
    return mods


def test_torch_only_in_torch_side_tools_and_matplotlib_only_inside_functions():
    offenders = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG)
        top = _module_level_imports(_tree(path))
        if any(m == "matplotlib" or m.startswith("matplotlib.") for m in top):
            offenders.append(f"{rel}: matplotlib at module level")
        if rel.parts[0] in TORCH_ALLOWED:
            continue
        # outside the tools, torch may only be imported lazily inside functions (verbs that run the tools)
        if any(m == "torch" or m.startswith("torch.") for m in top):
            offenders.append(f"{rel}: torch at module level")
    assert not offenders, offenders


def _run(code: str) -> str:
    env = dict(os.environ, TPSIM_CACHE_DIR="off")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


_HEAVY = "bad = [m for m in ('torch', 'matplotlib') if m in sys.modules]\nprint('HEAVY:' + ','.join(bad))\n"


def test_the_api_cli_and_plan_pull_in_neither_torch_nor_matplotlib():
    """Importing the API and the CLI, then running `tpsim plan`, loads neither torch nor matplotlib (`tpsim
    estimate`: test_estimate_imports_only_what_it_runs, whose list holds both)."""
    argv = ["plan", "--model", "gpt3-1.3b", "--layers", "4", "--cluster", "dgx-a100", "--gpus", "8", "--global-batch",
            "32", "--top", "3", "--vpp", "1", "--micro-batch", "1", "2", "--no-progress", "--no-cache"]
    code = ("import sys, tpsim, tpsim.estimator, tpsim.search, tpsim.cli, tpsim.calibration\n" + _HEAVY
            + f"from tpsim.cli import main\nrc = main({argv!r})\nassert rc == 0, rc\n" + _HEAVY)
    out = _run(code)
    heavy = [ln for ln in out.strip().splitlines() if ln.startswith("HEAVY:")]
    assert heavy == ["HEAVY:", "HEAVY:"], out[-500:]


ESTIMATE_ARGV = ["estimate", "--model", "llama3-8b", "--layers", "4", "--cluster", "dgx-h100", "--gpus", "16",
                 "--tp", "2", "--global-batch", "64", "--json"]
NOT_FOR_ESTIMATE = ("torch", "matplotlib", "pandas", "networkx", "scipy", "numpy.ma", "tempfile", "tpsim.search",
                    "tpsim.launch", "tpsim.report", "tpsim.validate", "tpsim.profiler", "tpsim.trace",
                    "tpsim.opgraph.estimate", *(f"tpsim.cli.{verb}" for verb in ("plan", "report", "model", "topo",
                                                                                "collective", "calibrate", "profile",
                                                                                "validate", "trace", "graph")))
"""modules `tpsim estimate` of a preset never needs (issue 9: what its process start imports). Loaded means
imported: a submodule (``pandas.core``) counts as its package."""


def _loaded(cache_dir: str) -> tuple[set[str], str]:
    code = ("import sys, json\nfrom tpsim.cli import main\n"
            f"rc = main({ESTIMATE_ARGV!r})\nassert rc == 0, rc\n"
            "print('MODULES:' + json.dumps(sorted(sys.modules)))\n")
    env = dict(os.environ, TPSIM_CACHE_DIR=cache_dir)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    import json

    line = out.stdout.strip().splitlines()[-1]
    return set(json.loads(line.removeprefix("MODULES:"))), out.stdout


def _heavy(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if n in modules or any(m.startswith(n + ".") for m in modules))


def test_estimate_imports_only_what_it_runs(tmp_path):
    """`tpsim estimate` imports its own verb only (not every verb to build the parser), no data-frame, graph
    or plotting library, not numpy.ma (NumPy 2's plain np.unique imports it), not tempfile; and once its
    YAML files are in the parse cache, not PyYAML either; nor cold, or with the cache off: tpsim's own files
    come parsed in the shipped parse seed (tpsim.parsecache.SEED_FILE; regenerate it with
    ``python tests/test_parsecache.py --write`` after editing one). The --json output is the same every time."""
    cold, cold_out = _loaded(str(tmp_path / "cache"))
    assert "tpsim.cli.estimate" in cold and "tpsim.estimator" in cold
    assert not _heavy(cold, NOT_FOR_ESTIMATE + ("yaml",)), _heavy(cold, NOT_FOR_ESTIMATE + ("yaml",))
    warm, warm_out = _loaded(str(tmp_path / "cache"))
    assert not _heavy(warm, NOT_FOR_ESTIMATE + ("yaml",)), _heavy(warm, NOT_FOR_ESTIMATE + ("yaml",))
    assert warm_out.rsplit("MODULES:", 1)[0] == cold_out.rsplit("MODULES:", 1)[0]
    off, off_out = _loaded("off")
    assert not _heavy(off, NOT_FOR_ESTIMATE + ("yaml",)), _heavy(off, NOT_FOR_ESTIMATE + ("yaml",))
    assert off_out.rsplit("MODULES:", 1)[0] == cold_out.rsplit("MODULES:", 1)[0]


def test_cli_without_a_verb_still_registers_every_verb():
    from tpsim.cli import VERB_MODULES, build_parser

    verbs = build_parser([])._subparsers._group_actions[0].choices   # noqa: SLF001 - argparse's own table
    assert set(verbs) == {m.replace("_", "-") for m in VERB_MODULES}
    assert set(build_parser(["estimate", "--tp", "2"])._subparsers._group_actions[0].choices) == {"estimate"}
    assert set(build_parser(["--version"])._subparsers._group_actions[0].choices) == set(verbs)
    assert set(build_parser(["estimat"])._subparsers._group_actions[0].choices) == set(verbs)
    assert set(build_parser(["--help", "estimate"])._subparsers._group_actions[0].choices) == set(verbs)
    assert set(build_parser(["bench-collectives"])._subparsers._group_actions[0].choices) == {"bench-collectives"}
