"""Context- and expert-parallel validation cases: the block with its attention over cp and its experts over ep.

:mod:`.case` (torch-free) what runs, :mod:`.predict` the cost model's figures, :mod:`.scale` the fit to this
machine, :mod:`.report` the comparison; rank side (torch): :mod:`.block`, :mod:`.run`, :mod:`.rec`."""
