"""Design rules: the estimator and planner never import torch or matplotlib; layers import downwards only."""

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "tpsim"

# lower layers must not import higher ones (ARCHITECTURE.md: dependency direction)
LAYERS = ["errors", "units", "model", "hardware", "plan", "tp_plan", "topology", "collectives", "compute",
          "estimator", "search", "report", "cli"]
TORCH_ALLOWED = ("validate", "profiler", "bench", "trace")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level >= 1 and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tpsim."):
            names.add(node.module.split(".")[1])
    return names


def test_import_direction():
    problems = []
    for i, layer in enumerate(LAYERS):
        files = [PKG / f"{layer}.py"] if (PKG / f"{layer}.py").exists() else list((PKG / layer).rglob("*.py"))
        for path in files:
            for name in _imports(path):
                if name in LAYERS and LAYERS.index(name) > i:
                    problems.append(f"{path.relative_to(PKG)} imports {name}")
    assert not problems, problems


def test_estimator_and_planner_do_not_import_torch_or_matplotlib():
    code = ("import sys, tpsim, tpsim.estimator, tpsim.cli\n"
            "import tpsim.search\n"
            "bad = [m for m in ('torch', 'matplotlib') if m in sys.modules]\n"
            "print(','.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_torch_only_at_module_level_in_allowed_packages():
    offenders = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG)
        if rel.parts[0] in TORCH_ALLOWED:
            continue
        tree = ast.parse(path.read_text())
        for node in tree.body:  # module level: verbs import torch lazily inside their run()
            mods = []
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                mods = [node.module]
            if any(m == "torch" or m.startswith("torch.") for m in mods):
                offenders.append(str(rel))
    assert not offenders, offenders
