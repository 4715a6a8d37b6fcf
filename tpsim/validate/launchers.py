"""The user's launcher (torch-free): detect a launch ``tpsim validate`` runs inside, and print the commands that
start one.

``tpsim validate`` normally starts its own ranks (:mod:`tpsim.validate.launch`). Started *by* a launcher instead,
one process per rank, it joins that launch (:mod:`tpsim.validate.joined`):

* **torchrun / torch elastic** (``python -m torch.distributed.run``): ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
  ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` (torchrun sets them for every worker; the c10d
  rendezvous has already assembled the nodes);
* **Slurm** under ``srun`` (``SLURM_STEP_ID`` set: a job step, not the batch script itself): ``SLURM_PROCID`` is
  the rank, ``SLURM_NTASKS`` the world, ``SLURM_LOCALID`` the local rank, ``SLURM_STEP_NODELIST`` (or
  ``SLURM_NODELIST``) names the nodes, the first one hosts the rendezvous (``MASTER_ADDR`` overrides it), on
  ``MASTER_PORT`` (the sbatch script of :func:`sbatch_script` exports a port the first node found free) or else
  a port derived from the job id (``29500 + SLURM_JOB_ID % 20000``: different jobs, different ports).

torchrun wins when both are set (``srun torchrun ...``: torchrun's workers are the ranks).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import InputError

LAUNCHERS = ("torchrun", "slurm")
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
SLURM_VARS = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_ID")
SLURM_PORT_BASE, SLURM_PORT_SPAN = 29500, 20000


@dataclass(frozen=True)
class Joined:
    """This process's place in a launch started by someone else."""

    launcher: str
    """"torchrun" or "slurm"."""
    rank: int
    world: int
    local_rank: int
    local_world: int
    master_addr: str
    master_port: int
    host: str

    @property
    def nnodes(self) -> int:
        return max(1, self.world // self.local_world)

    def env(self) -> dict[str, str]:
        """The ``env://`` variables torch.distributed reads (Slurm's translated)."""
        return {"RANK": str(self.rank), "WORLD_SIZE": str(self.world), "LOCAL_RANK": str(self.local_rank),
                "LOCAL_WORLD_SIZE": str(self.local_world), "MASTER_ADDR": self.master_addr,
                "MASTER_PORT": str(self.master_port)}


def _int(env: Mapping[str, str], name: str, minimum: int = 0) -> int:
    value = env.get(name, "")
    try:
        n = int(value)
    except ValueError:
        raise InputError(f"{name}={value!r} (set by the launcher) is not an integer") from None
    if n < minimum:
        raise InputError(f"{name}={value!r} (set by the launcher) must be >= {minimum}")
    return n


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: ``node[03-05,9],gpu1`` -> ``node03``; ``a,b`` -> ``a``."""
    text = nodelist.strip()
    m = re.match(r"([^,\[]+)(\[([^\]]*)\])?", text)
    if not text or m is None:
        raise InputError(f"SLURM_NODELIST={nodelist!r} names no host")
    prefix, ranges = m.group(1), m.group(3)
    if ranges is None:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    if not first.isdigit():
        raise InputError(f"SLURM_NODELIST={nodelist!r}: range {ranges!r} is not numeric")
    return prefix + first


def tasks_on_first_node(value: str) -> int:
    """``SLURM_TASKS_PER_NODE`` / ``SLURM_STEP_TASKS_PER_NODE`` (``2(x3),1``): the first node's count."""
    m = re.match(r"(\d+)", value.strip())
    if m is None:
        raise InputError(f"SLURM_TASKS_PER_NODE={value!r} is not a task count")
    return int(m.group(1))


def detect(env: Mapping[str, str] | None = None) -> Joined | None:
    """The launch this process runs in, or None (``tpsim validate`` then starts its own ranks)."""
    env = os.environ if env is None else env
    host = os.uname().nodename
    if all(k in env for k in TORCHRUN_VARS):
        world = _int(env, "WORLD_SIZE", 1)
        rank = _int(env, "RANK")
        if rank >= world:
            raise InputError(f"RANK={rank} must be < WORLD_SIZE={world}")
        local_world = _int(env, "LOCAL_WORLD_SIZE", 1) if "LOCAL_WORLD_SIZE" in env else world
        return Joined("torchrun", rank, world, _int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else rank,
                      local_world, env["MASTER_ADDR"], _int(env, "MASTER_PORT", 1), host)
    if all(k in env for k in SLURM_VARS):
        world = _int(env, "SLURM_NTASKS", 1)
        rank = _int(env, "SLURM_PROCID")
        if rank >= world:
            raise InputError(f"SLURM_PROCID={rank} must be < SLURM_NTASKS={world}")
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_NODELIST") or env.get("SLURM_JOB_NODELIST", "")
        addr = env.get("MASTER_ADDR") or first_host(nodelist)
        if "MASTER_PORT" in env:
            port = _int(env, "MASTER_PORT", 1)
        else:
            port = SLURM_PORT_BASE + _int(env, "SLURM_JOB_ID") % SLURM_PORT_SPAN if "SLURM_JOB_ID" in env else 0
            if not port:
                raise InputError("under srun without MASTER_PORT or SLURM_JOB_ID: no rendezvous port")
        per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or str(world)
        local = _int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0
        return Joined("slurm", rank, world, local, tasks_on_first_node(per_node), addr, port, host)
    return None


# ---- printing the commands ----------------------------------------------------------------------------
def _strip_print_launch(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--print-launch":
            skip = True
            continue
        if a.startswith("--print-launch="):
            continue
        out.append(a)
    return out


def worker_args(validate_argv: list[str]) -> list[str]:
    """``-m tpsim.validate.worker --validate ARGS``: the rank's command (``tpsim validate ARGS`` joined)."""
    args = _strip_print_launch(validate_argv)
    if args[:1] == ["validate"]:
        args = args[1:]
    return ["-m", "tpsim.validate.worker", "--validate", *args]


def torchrun_line(validate_argv: list[str], nnodes: int, nproc: int, rdzv_id: str,
                  endpoint: str = "$MASTER_ADDR:$MASTER_PORT") -> str:
    """The command to run on every node (the same line; torchrun's c10d rendezvous assigns the ranks)."""
    head = ["torchrun", f"--nnodes={nnodes}", f"--nproc-per-node={nproc}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}", "--max-restarts=0"]
    tail = worker_args(validate_argv)
    return " ".join(head) + " " + " ".join(shlex.quote(a) for a in tail)


def sbatch_script(validate_argv: list[str], nnodes: int, nproc: int, backend: str, job_name: str,
                  time_limit: str = "00:30:00") -> str:
    """An sbatch script: one task per rank under ``srun`` (each joins as a Slurm rank), the rendezvous on the
    first node on a port found free there; a dead task ends the step (``--kill-on-bad-exit``)."""
    tail = " ".join(shlex.quote(a) for a in worker_args(validate_argv))
    gpus = f"#SBATCH --gpus-per-node={nproc}\n" if backend == "nccl" else ""
    return (f"#!/bin/bash\n"
            f"#SBATCH --job-name={job_name}\n"
            f"#SBATCH --nodes={nnodes}\n"
            f"#SBATCH --ntasks-per-node={nproc}\n"
            f"{gpus}"
            f"#SBATCH --time={time_limit}\n"
            f"#SBATCH --output={job_name}-%j.out\n"
            "set -euo pipefail\n"
            "# the rendezvous: the first node of the allocation (where this script runs), a port free there\n"
            'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
            "export MASTER_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind((\"\", 0)); "
            "print(s.getsockname()[1])')\n"
            f"srun --kill-on-bad-exit=1 --ntasks-per-node={nproc} python3 {tail}\n")
