"""Reports: the studies behind the charts (:mod:`.analysis`), the five charts (:mod:`.charts`, matplotlib
imported inside the functions) and the Markdown report (:mod:`.markdown`)."""

from __future__ import annotations

from .analysis import (BandwidthGrid, ContextSweep, Sweep, bandwidth_grid, best_per, context_sweep, ep_sweep, scaling,
                       tp_sweep)
from .markdown import ReportInputs, check_report_dir, md_table, write_report

__all__ = ["ReportInputs", "write_report", "check_report_dir", "md_table", "tp_sweep", "scaling", "bandwidth_grid",
           "best_per", "Sweep", "BandwidthGrid", "ep_sweep", "context_sweep", "ContextSweep"]
