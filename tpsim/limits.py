"""Documented bounds on every user-supplied number (issue 13): anything outside is refused with one line
naming the field and the value, before any work or allocation.

The maxima are far above anything trained today (a 131,072-GPU cluster, a 1M-token context, a 256k
vocabulary) and far below what would overflow an int64 product or exhaust memory while building tables.
Change a bound here, with the reason, and every checker follows.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from .errors import InputError

LIMITS: dict[str, int] = {
    # model shape
    "num_layers": 4096,
    "hidden_size": 1 << 20,
    "num_attention_heads": 1 << 16,
    "num_kv_heads": 1 << 16,
    "head_dim": 1 << 14,
    "ffn_hidden_size": 1 << 22,
    "vocab_size": 1 << 24,
    "seq_len": 1 << 24,
    "max_positions": 1 << 26,
    "norms_per_layer": 8,
    "num_experts": 1 << 14,
    "experts_per_token": 1 << 10,
    "moe_ffn_hidden_size": 1 << 22,
    "num_shared_experts": 1 << 10,
    "shared_expert_ffn_hidden_size": 1 << 22,
    "first_dense_layers": 4096,
    "moe_layer_freq": 4096,
    "router_groups": 1 << 14,
    "router_group_topk": 1 << 14,
    "mtp_layers": 64,
    "q_lora_rank": 1 << 20,
    "kv_lora_rank": 1 << 20,
    "qk_nope_head_dim": 1 << 14,
    "qk_rope_head_dim": 1 << 14,
    "v_head_dim": 1 << 14,
    "sliding_window": 1 << 24,
    # plan and cluster
    "gpus": 1 << 20,
    "tp": 1 << 12,
    "cp": 1 << 12,
    "ep": 1 << 14,
    "pp": 1 << 12,
    "vpp": 1 << 10,
    "pp_layers": 1 << 20,  # decoder layers of the first or last pipeline stage (--pp-first-layers)
    "pp_chunks": 1 << 16,  # model chunks of an explicit pipeline layout (pp x vpp, --pp-layout)
    "dp": 1 << 20,
    "micro_batch": 1 << 16,
    "global_batch": 1 << 26,
    # measurement and local runs
    "bytes": 1 << 60,      # an exbibyte: beyond any buffer, still exact in int64
    "ranks": 1 << 10,
    "threads": 1 << 10,
    "nproc": 1 << 10,
    "nnodes": 1 << 14,
    "iters": 1 << 16,      # timed iterations of one measurement (nccl-tests uses 20)
    "warmup": 1 << 16,
    "reps": 1 << 16,
    "repeat": 1 << 10,  # launches of one validation (tpsim validate --repeat)
    "measured_ranks": 1 << 16,  # ranks of one measured collective (a calibration input row)
    "kernel_dim": 1 << 40,  # one dimension (m, n, k, sequence, elements) of a profiled kernel
    # output
    "top": 1 << 20,
    # topology files: one group of devices in a node template, lanes of one link, switch ports, torus sides
    "node_devices": 1 << 12,
    "lanes": 1 << 10,
    "radix": 1 << 12,
    "torus_dim": 1 << 12,
}
"""field -> largest accepted value (inclusive); the smallest is 1 unless a checker says 0."""

FLOAT_LIMITS: dict[str, float] = {
    "mem_limit_gib": float(1 << 20),    # 1 PiB per GPU
    "gpu_hour_price": 1e6,              # dollars per GPU-hour
    "timeout_s": 7 * 24 * 3600.0,       # a week: process-group and run time limits
    "budget_s": 7 * 24 * 3600.0,
    "max_kernel_s": 3600.0,
    "redo_noisy_pct": 1e4,
    # figures of stack and calibration files (issue 26: a negative or NaN figure was used as given)
    "host_us": 1e6,                     # host time of one op, layer or collective: a second is already absurd
    "bucket_elements": 1e13,            # a DDP/ZeRO bucket or prefetch size, in elements (10x a 1T model)
    "bytes_per_param": 1024.0,          # optimizer traffic per parameter (fused Adam moves 34-46 bytes)
    "bytes_per_element": 64.0,          # bytes kept per activation element (fp8 caches: 1, fp32: 4)
    "latency_us": 1e7,                  # one message's latency on a link (10 s)
    "bw_GBps": 1e6,                     # one link's bandwidth (1 PB/s; NVLink 5 is 900 GB/s)
    "calibration_scale": 1e3,
    "op_flops": 1e21,                   # one traced op of one micro-batch (a 1T-parameter layer's GEMM is ~1e16)
    "op_bytes": 1e18,                   # bytes one traced op moves (an exabyte)           # a fitted factor on kernel times (calibrate bounds it to 1/4..4)
    "tokens": 1e16,                     # training tokens (640x Llama 3's 15.6T): tpsim train-time, --tokens
}
"""field -> largest accepted value of a real-valued input (finite and positive unless a checker says 0)."""

MAX_CLI_INT = (1 << 31) - 1
"""Any integer flag without an entry in LIMITS: no count in tpsim needs more."""
MAX_INPUT_BYTES = 64 << 20
"""Largest text input read (config, profile CSV, measurements): the shipped CPU profile is 0.3 MB."""
MAX_YAML_BYTES = 4 << 20
"""Largest YAML input (topology and calibration files are under 20 kB)."""
RANK_PROCESS_BYTES = 300 << 20
"""Resident memory of one local torch rank (measured: ~220 MB after ``import torch`` plus buffers); local
runs (``bench-collectives``, ``validate``) refuse more ranks than the machine's available memory holds."""

MAX_GRAPH_NODES = 200_000
"""A full networkx graph is built only below this many vertices (``tpsim topo`` on irregular clusters);
larger clusters use the structural model."""
PLAN_SEARCH_RATE = 500_000
"""Plans of a space a search gets through per second, the slowest measured (tpsim plan --no-cache on a loaded
2-core machine, 2026-12-01: Llama-3 8B on 512 H100, 210,240 plans of which 17,058 evaluated, 0.33 s = 638k/s;
GPT-3 175B on 1024 A100 994k/s; Mixtral 8x7B --full-space on 256 H100, 1,360,512 plans, 3.7M/s; DeepSeek-V3
--full-space on 2048 H100, 5,047,488 plans, 4.9M/s, 296 MB peak): enumeration and the plan rules drop most
plans at millions per second, the estimator evaluates the rest at about 1M/s per core (README)."""
MAX_SEARCH_S = 60.0
"""Longest search (seconds at :data:`PLAN_SEARCH_RATE`) run without ``--allow-large-space``."""
MAX_PLANS = int(PLAN_SEARCH_RATE * MAX_SEARCH_S)
"""Plans a search may enumerate without ``--allow-large-space``: those that take about a minute at the measured
rate (30 M). The full spaces of the shipped presets are far below it."""
MAX_NODE_PAIRS = 1 << 20
"""GPU pairs inside one node the collective model tabulates (routes, pair codes: work and memory grow with
the square of the GPUs per node): 1,024 GPUs in one node (a local-cpu run of LIMITS["ranks"]) take ~3 s;
an NVL576 domain is 331,776 pairs. 16,000 ranks on one host took 2.3 GB and minutes (issue 26)."""


def check_node_pairs(gpus_per_node: int, where: str) -> None:
    """Refuse, before any table is built, a node whose GPU pairs exceed :data:`MAX_NODE_PAIRS`."""
    pairs = int(gpus_per_node) ** 2
    if pairs > MAX_NODE_PAIRS:
        top = int(MAX_NODE_PAIRS ** 0.5)
        raise InputError(f"{where}: {gpus_per_node:,} GPUs in one node; the collective model handles at most "
                         f"{top:,} per node (its per-pair tables grow with the square); use a cluster of nodes")


MAX_NODE_DEVICES = 1 << 14
"""Devices of one node (all groups): a GB200 NVL72 rack is 72 GPUs + 18 switches; the largest scale-up domain
announced (NVL576) is 576. A single-node cluster of ``count: any`` ranks (local-cpu) is bounded by it too."""
MAX_NODE_LINKS = 1 << 20
"""Links of one node after expanding its patterns (``all`` between 4096 GPUs and 4096 switches is 16.7M
links, 3.7 GB: refused before building)."""
MAX_INPUT_NUMEL = 1 << 40
"""Elements of one ``tpsim trace --input-shape`` tensor (built on the meta device: no data)."""

# sweep files (tpsim design SWEEP.yaml; tpsim/design/sweep.py)
MAX_DESIGNS = 20_000
"""designs a sweep may have without ``--allow-large-sweep``."""
HARD_MAX_DESIGNS = 2_000_000
"""designs no sweep may have (the table alone would be gigabytes)."""
MAX_AXIS_VALUES = 10_000
"""values one axis (a list or a range) of a sweep may have."""
MAX_MODELS = 64
"""models (entries of ``models``) one sweep may list."""


MAX_JSON_DEPTH = 64
"""Nesting depth of a JSON or YAML input."""
MAX_CONFIG_BYTES = 1 << 20
"""Size of a model config.json (published ones are 1-10 kB; the largest, with label maps, well under 100 kB)."""
MAX_YAML_NODES = 1_000_000
"""Scalar and collection nodes a YAML document may expand to (alias/anchor bombs)."""
MAX_JSON_ITEMS = 4_000_000
"""Values (array elements and object members) of one JSON input, counted from its commas, colons and brackets
before parsing: the largest shipped op graph (traced UNet) has about 9,000; a parsed value costs ~100 bytes, so
the bound keeps a document near 400 MB at the very worst."""
MAX_NUMBER_DIGITS = 40
"""Digits of one number in a JSON, YAML, CSV or launch file (an int64 has 19; a float written in full, 17
significant digits plus zeros): converting a 5,000-digit integer is quadratic, and no count needs more."""
MAX_OPGRAPH_BYTES = 64 << 20
"""Size of an ``*.ops.json`` op graph (the shipped traced UNet is 129 kB; a million-op graph about 60 MB)."""
MAX_LAUNCH_BYTES = 1 << 20
"""Size of a launch file (Megatron/DeepSpeed script, ds_config.json, NeMo YAML, torchtitan TOML): published
ones are 1-20 kB."""


WORK_LIMITS: dict[str, tuple[float, bool, str]] = {
    # quantity: (bound, hard, unit). tpsim/work.py estimates each verb's amounts from its inputs before any
    # work; a soft bound is lifted by --allow-large-work, a hard one never (the memory would not be there).
    "node_gpu_pairs": (MAX_NODE_PAIRS, True, "GPU pairs in one node (the collective model's per-pair tables)"),
    "node_devices": (MAX_NODE_DEVICES, True, "devices in one node"),
    "plans": (MAX_PLANS, False, "candidate plans (tp x cp x ep x pp x (vpp, schedule) x sp x recompute x ZeRO "
                                "x micro-batch x overlap; the bound is a minute of search)"),
    "searches": (16, False, "plan searches (each up to a minute; --scaling-span 8 makes 7)"),
    "designs": (MAX_DESIGNS, False, "designs"),
    "planning_tasks": (5_000, False, "planning tasks (one plan search each, ~0.7 s on one core)"),
    "collective_points": (1 << 10, False, "message sizes"),
    "input_bytes": (256 << 20, False, "bytes of input files"),
    "local_ranks": (LIMITS["ranks"], True, "local ranks"),
    "rank_memory_share": (1.0, False, "times the memory available here (RANK_PROCESS_BYTES per rank)"),
    "input_elements": (MAX_INPUT_NUMEL, True, "input elements"),
    "kernel_points": (20_000, False, "kernel points (the full CUDA grid of every dtype is 15,642)"),
}
"""What a verb may ask for before it starts (tpsim/work.py, one estimator per verb)."""


_ASCII_DIGITS = frozenset("0123456789")


def ascii_int(text: Any, signed: bool = False) -> int | None:
    """``text`` as an int when it is ASCII decimal digits only (``-`` first if ``signed``) and at most
    :data:`MAX_NUMBER_DIGITS` of them; else None. ``str.isdigit`` accepts ``²`` and ``١`` (then ``int`` fails
    or reads another number) and a 5,000-digit number costs a quadratic conversion: readers use this."""
    if not isinstance(text, str):
        return None
    body = text[1:] if signed and text.startswith("-") else text
    if not body or len(body) > MAX_NUMBER_DIGITS or not set(body) <= _ASCII_DIGITS:
        return None
    return int(text)


def show(value: Any) -> str:
    """``repr`` of a value for a one-line message: long numbers and strings abbreviated."""
    text = repr(value)
    if len(text) <= 40:
        return text
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{text[:12]}...({len(text.lstrip('-'))} digits)"
    return f"{text[:24]}...({len(text)} characters)"


def check_int(field: str, value: Any, where: str = "", minimum: int = 1, maximum: int | None = None) -> int:
    """``value`` as an int within ``[minimum, LIMITS[field]]``; strings, booleans, NaN, infinities and floats
    with a fractional part are refused. ``where`` prefixes the message (a file name or a flag)."""
    prefix = f"{where}: " if where else ""
    top = maximum if maximum is not None else LIMITS.get(field)
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, int)):
        value = int(value)  # a numpy integer is an integer (issue 26: it was refused as "not an integer")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{prefix}{field}={show(value)} must be an integer")
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise InputError(f"{prefix}{field}={show(value)} must be an integer")
        value = int(value)
    if value < minimum:
        raise InputError(f"{prefix}{field}={show(value)} must be >= {minimum}")
    if top is not None and value > top:
        raise InputError(f"{prefix}{field}={show(value)} is above the supported maximum {top}")
    return int(value)


def check_float(field: str, value: Any, where: str = "", minimum: float = 0.0, inclusive: bool = False,
                maximum: float | None = None) -> float:
    """``value`` as a finite float above ``minimum`` (or equal, if ``inclusive``) and at most
    ``FLOAT_LIMITS[field]``; strings, booleans, NaN and infinities are refused."""
    prefix = f"{where}: " if where else ""
    top = maximum if maximum is not None else FLOAT_LIMITS.get(field)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{prefix}{field}={show(value)} must be a number")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise InputError(f"{prefix}{field}={show(value)} must be a finite number")
    if number < minimum or (number == minimum and not inclusive):
        raise InputError(f"{prefix}{field}={show(value)} must be {'>=' if inclusive else '>'} {minimum:g}")
    if top is not None and number > top:
        raise InputError(f"{prefix}{field}={show(value)} is above the supported maximum {top:g}")
    return number


def check_local_ranks(nproc: int, flag: str = "--nproc", available: int | None = None) -> None:
    """Refuse to start more local torch ranks than the machine's available memory holds
    (:data:`RANK_PROCESS_BYTES` each), before any rank starts."""
    check_int("nproc", nproc, flag)
    free = available_memory() if available is None else available
    if free and nproc * RANK_PROCESS_BYTES > free:
        raise InputError(f"{flag}={nproc}: {nproc} local ranks need about {nproc * RANK_PROCESS_BYTES / 2**30:.0f} "
                         f"GiB ({RANK_PROCESS_BYTES >> 20} MB each); this machine has {free / 2**30:.1f} GiB "
                         "available")


def available_memory() -> int:
    """Bytes of memory available to new processes (``MemAvailable`` of /proc/meminfo; 0 if unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0
