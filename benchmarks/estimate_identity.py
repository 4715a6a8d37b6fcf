"""Byte-identity of the estimator's outputs across a speed or refactor change (issue 21 speed work).

    python benchmarks/estimate_identity.py --write before.json   # on the old code
    python benchmarks/estimate_identity.py --check before.json   # on the new code: exit 1 on any difference

Digests (sha256 of the bytes, dtype and shape of every array; repr of everything else) of every
``EstimateBatch`` field for the valid plans of GPT-3 175B on 1024 A100s (the whole batch at once, in the
planner's chunks, and a stride of plans one at a time through ``estimate``), Llama-3 70B on 64 H100s with every
pipeline schedule searched, Mixtral 8x7B with expert parallelism, an fp8 space on H100, and the ``--json``
output of ``tpsim estimate`` and ``tpsim plan``. About a minute on one core.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import subprocess
import sys

import numpy as np


def _digest(value) -> str:
    if isinstance(value, np.ndarray):
        h = hashlib.sha256(np.ascontiguousarray(value).tobytes())
        h.update(f"{value.dtype}{value.shape}".encode())
        return h.hexdigest()[:16]
    if isinstance(value, dict) or hasattr(value, "items"):
        return json.dumps({str(k): _digest(v) for k, v in sorted(value.items())})
    if dataclasses.is_dataclass(value):
        return _digest({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    return repr(value)


def batch_digest(batch) -> dict[str, str]:
    return {f.name: _digest(getattr(batch, f.name)) for f in dataclasses.fields(batch)}


CASES = (  # name, model, cluster, gpus, global batch, SearchSpace fields
    ("gpt3-175b", "gpt3-175b", "dgx-a100", 1024, 1536, {}),
    ("llama3-70b-schedules", "llama3-70b", "dgx-h100", 64, 512,
     dict(schedule=("1f1b", "gpipe", "zb-h1", "zbv", "interleaved-zb", "dualpipe", "dualpipev"))),
    ("mixtral-8x7b", "mixtral-8x7b", "dgx-h100", 64, 512, {}),
    ("gpt3-175b-fp8", "gpt3-175b", "dgx-h100", 256, 512, dict(dtype="fp8")),
)


def run_cases() -> dict[str, str]:
    import tpsim
    from tpsim.estimator import context_for, estimate_batch
    from tpsim.model import load_model
    from tpsim.search import SearchSpace, enumerate_plans, violations
    from tpsim.search.planner import CHUNK
    from tpsim.topology import load_cluster

    out: dict[str, str] = {}
    for name, model_name, cluster_name, gpus, gb, fields in CASES:
        model, cluster = load_model(model_name), load_cluster(cluster_name, gpus=gpus)
        enum = enumerate_plans(model, gpus, gb, SearchSpace(**fields))
        plans = enum.plans.take(np.flatnonzero(violations(model, enum.plans, gpus) == 0))
        out[f"{name}/plans"] = str(len(plans))
        whole = estimate_batch(model, cluster, plans)
        for k, v in batch_digest(whole).items():
            out[f"{name}/whole/{k}"] = v
        context_for(model, cluster).clear_results()
        parts = [estimate_batch(model, cluster, plans.take(slice(s, s + CHUNK)))
                 for s in range(0, len(plans), CHUNK)]
        for field in dataclasses.fields(whole):
            vals = [getattr(p, field.name) for p in parts]
            if isinstance(vals[0], np.ndarray) and vals[0].shape[:1] == (len(parts[0]),):
                out[f"{name}/chunks/{field.name}"] = _digest(np.concatenate(vals))
        stride = max(1, len(plans) // 150)
        singles = []
        for i in range(0, len(plans), stride):
            est = tpsim.estimate(model, cluster, plans.plan(i))
            singles.append(json.dumps(est.to_dict(), sort_keys=True, default=repr))
        out[f"{name}/singles"] = hashlib.sha256("\n".join(singles).encode()).hexdigest()[:16]
    return out


CLI = (
    ["estimate", "--model", "gpt3-175b", "--cluster", "dgx-a100", "--gpus", "1024", "--tp", "8", "--pp", "16",
     "--sp", "--recompute", "selective", "--json"],
    ["estimate", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "64", "--tp", "8", "--pp", "4",
     "--vpp", "2", "--schedule", "zbv", "--stack", "torchtitan", "--zero", "2", "--json"],
    ["estimate", "--model", "gpt3-175b", "--cluster", "dgx-h100", "--gpus", "256", "--tp", "8", "--pp", "16",
     "--sp", "--dtype", "fp8", "--global-batch", "256", "--json"],
    ["plan", "--model", "gpt3-175b", "--cluster", "dgx-a100", "--gpus", "1024", "--global-batch", "1536",
     "--json"],
    ["plan", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "64", "--global-batch", "512",
     "--stack", "torchtitan", "--json"],
    ["plan", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "64", "--global-batch", "512",
     "--json"],
)


def run_cli() -> dict[str, str]:
    out = {}
    for argv in CLI:
        proc = subprocess.run([sys.executable, "-c", "import sys; from tpsim.cli import main; sys.exit(main())", *argv], capture_output=True, text=True)
        text = proc.stdout
        if proc.returncode == 0 and argv[0] == "plan":  # drop the planner's own wall time
            data = json.loads(text)
            data.pop("elapsed_s", None)
            text = json.dumps(data, sort_keys=True)
        out["cli " + " ".join(argv)] = f"rc={proc.returncode} " + hashlib.sha256(
            (text + proc.stderr).encode()).hexdigest()[:16]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", metavar="JSON")
    group.add_argument("--check", metavar="JSON")
    args = parser.parse_args()
    digests = {**run_cases(), **run_cli()}
    if args.write:
        with open(args.write, "w") as fh:
            json.dump(digests, fh, indent=1, sort_keys=True)
        print(f"{len(digests)} digests written to {args.write}")
        return 0
    with open(args.check) as fh:
        before = json.load(fh)
    moved = sorted(k for k in before.keys() | digests.keys() if before.get(k) != digests.get(k))
    for k in moved:
        print(f"DIFFERS: {k}: {before.get(k)} -> {digests.get(k)}")
    print(f"{len(digests)} digests, {len(moved)} differ")
    return 1 if moved else 0


if __name__ == "__main__":
    sys.exit(main())
