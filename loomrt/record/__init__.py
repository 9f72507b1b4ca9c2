"""The record: the append-only log of a run's events, and the stores that keep it."""

from loomrt.record.sqlite import SQLiteStore, default_store, loomrt_home
from loomrt.record.store import Store

open_store = default_store
"""The one place a process's store is chosen (``$LOOMRT_DB_URL``, else ``$LOOMRT_HOME``)."""

__all__ = ["Store", "SQLiteStore", "default_store", "open_store", "loomrt_home"]
