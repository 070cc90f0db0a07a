"""Batch jobs over exported replica logs, on Apache Spark (docs/pipeline.md).

- :mod:`~p2psync.pipeline.export` — a store's message index and event log as Parquet (no Spark);
- :mod:`~p2psync.pipeline.reconcile` — digests, divergent groups, the per-replica repair plan;
- :mod:`~p2psync.pipeline.fanout` — delivery targets, relay assignment, strategy costs;
- :mod:`~p2psync.pipeline.audit` — closure audit of every stored record;
- :mod:`~p2psync.pipeline.session` — starting Spark (settings, Java check, progress);
- :mod:`~p2psync.pipeline.strategies` — the delivery strategies and the relay's k (no Spark).

The ``export`` and ``pipeline`` commands are in :mod:`p2psync.cli.pipeline`.

Importing this package does not import Spark; the job modules do.
"""
