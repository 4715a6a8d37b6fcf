"""Block validation cases: one transformer block at a TP degree (tp x sp x hidden x seq), and the pieces every
case shares: :mod:`.case` (``CaseBase``), :mod:`.predict`, :mod:`.scale`, :mod:`.report` (torch-free) and
:mod:`.measure` (rank side: clocks, numerics, collective recorder)."""
