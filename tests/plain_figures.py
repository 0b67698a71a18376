"""The reference the Spark job is checked against: the plain engine, ``ftpbc.analytics.plain``.

Kept as the name the aggregate tests and ``bench/bench_aggregate.py`` import; the computation
itself lives once, in the package (``ftpbc aggregate --engine plain`` runs it).
"""

from __future__ import annotations

from ftpbc.analytics.plain import PlainResult, figures, list_records, percentile, run

__all__ = ["PlainResult", "figures", "list_records", "percentile", "run"]
