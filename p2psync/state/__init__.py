"""Replication state kept in a store: the ledger of links and checkpoints, the passive's
checkpoint copies and origins, the group committer, the local dependency fetcher, the read
authorizer, digests and log reads. Everything here touches SQLite (through
:class:`p2psync.dwn.store.Store`); the pure logic it serves is in :mod:`p2psync.replication`.
"""
