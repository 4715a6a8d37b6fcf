"""Before predicting: is the kernel profile of this machine? (launcher side, torch-free)

``python -m tpsim.profiler.probe`` times ~20 of the profile's points here, in a subprocess with the ranks'
thread count (:mod:`tpsim.profiler.probe`). If the median drift (measured / profile) is over 10%, the
prediction says so and, by default, uses the profile rescaled per kernel kind by the measured drift
(:class:`tpsim.compute.scaled.ScaledCompute`); with ``--reprofile`` it measures a quick profile of this machine
(``tpsim profile --grid quick``) and predicts with that instead. The report records what was done.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import TpsimError
from ..profiler.probe import ProbeResult
from ..procs import child_preexec

PROBE_TIMEOUT_S = 120.0
"""the probe aims at under 30 s; a machine so loaded that it takes 4x that is reported as a failure."""
REPROFILE_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class DriftCheck:
    """What the probe found and what the prediction does about it."""

    action: str
    """"none" (within 10%), "rescaled", "reprofiled", "calibration" (a calibration's compute factors are
    applied instead) or "skipped" (no profile, or --no-probe)."""
    probe: ProbeResult | None = None
    profile: Path | None = None
    """the profile the prediction uses (the quick one after --reprofile)."""
    scales: dict[str, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"action": self.action, "profile": str(self.profile) if self.profile else None,
                               "scales": self.scales}
        if self.probe is not None:
            p = self.probe.to_dict()
            out.update(median_drift=p["median_drift"], drift=p["drift"], exceeded=p["exceeded"],
                       threshold=p["threshold"], probe_seconds=p["seconds"], points=len(self.probe.points))
        return out


def run_probe(profile: Path, threads: int, timeout_s: float = PROBE_TIMEOUT_S) -> ProbeResult:
    """The probe in a subprocess (torch stays out of this process); its JSON answer."""
    cmd = [sys.executable, "-m", "tpsim.profiler.probe", str(profile), "--threads", str(threads)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, preexec_fn=child_preexec)
    except subprocess.TimeoutExpired:
        raise TpsimError(f"the kernel-profile probe took over {timeout_s:.0f} s (machine overloaded?); "
                         "rerun with --no-probe to skip it") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise TpsimError(f"the kernel-profile probe failed: {last}")
    return ProbeResult.from_dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def quick_profile(work: Path, threads: int, device: str = "cpu") -> Path:
    """``tpsim profile --grid quick --dtype fp32`` of this machine, into ``work``."""
    out = work / f"quick-{device}-{threads}t.csv"
    cmd = [sys.executable, "-m", "tpsim.cli", "profile", "--device", device, "--grid", "quick", "--dtype", "fp32",
           "--threads", str(threads), "--out", str(out), "--no-progress"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=REPROFILE_TIMEOUT_S, preexec_fn=child_preexec)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise TpsimError(f"--reprofile: tpsim profile failed: {last}")
    return out


def check_profile(profile: Path | None, threads: int, work: Path, reprofile: bool, enabled: bool = True,
                  device: str = "cpu") -> DriftCheck:
    """Probe ``profile`` and decide (see module docstring)."""
    if profile is None or not enabled:
        return DriftCheck(action="skipped", profile=profile)
    probe = run_probe(profile, threads)
    if not probe.exceeded:
        return DriftCheck(action="none", probe=probe, profile=profile)
    if reprofile:
        return DriftCheck(action="reprofiled", probe=probe, profile=quick_profile(work, threads, device))
    return DriftCheck(action="rescaled", probe=probe, profile=profile, scales=probe.scales())
