"""The example reports committed under ``reports/``; regenerate them all with::

    python -m tpsim.report.examples            # or: python -m tpsim.report.examples gpt3-175b-1024xa100

Each is exactly ``tpsim report --model M --cluster C --gpus N --global-batch B --out reports/NAME/``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ..model import load_model
from ..search import SearchSpace
from .markdown import ReportInputs, write_report

# name: (model, cluster, gpus, global batch); global batches are the published ones (GPT-3: Megatron-LM's
# train_gpt3_175b_distributed.sh, 1536; Llama 3 70B: the preset's 512 sequences of 8192 tokens = 4M tokens)
EXAMPLES = {
    "gpt3-175b-1024xa100": ("gpt3-175b", "dgx-a100", 1024, 1536),
    "llama3-70b-64xh100": ("llama3-70b", "dgx-h100", 64, 512),
}
REPORTS_DIR = Path("reports")


def command_for(name: str) -> str:
    """The equivalent ``tpsim report`` command line."""
    model, cluster, gpus, batch = EXAMPLES[name]
    return (f"tpsim report --model {model} --cluster {cluster} --gpus {gpus} --global-batch {batch} "
            f"--out {REPORTS_DIR / name}/")


def make(name: str, log=print) -> Path:
    """Write one example report (same defaults as the CLI: the preset's dtype and attention kind)."""
    model_name, cluster, gpus, batch = EXAMPLES[name]
    model = load_model(model_name)
    space = SearchSpace(dtype=model.default_plan.get("dtype", "bf16"),
                        attention=model.default_plan.get("attention", "flash"))
    command = f"python -m tpsim.report.examples {name}\n# same as: {command_for(name)}"
    inputs = ReportInputs(model=model, cluster=cluster, gpus=gpus, global_batch=batch, space=space,
                          command=command)
    return write_report(inputs, REPORTS_DIR / name, log=log, force=True)  # regenerating: replace the old report


def main(names: list[str]) -> int:
    for name in names or list(EXAMPLES):
        if name not in EXAMPLES:
            print(f"unknown example {name!r} (known: {', '.join(EXAMPLES)})", file=sys.stderr)
            return 2
        print(command_for(name), file=sys.stderr)
        started = time.perf_counter()
        path = make(name, log=lambda s: print(f"  {s}", file=sys.stderr))
        print(f"  wrote {path} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
