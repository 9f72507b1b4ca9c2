"""The record: the append-only log of a run's events, and the stores that keep it."""

from loomrt.record.sqlite import SQLiteStore, default_store, loomrt_home
from loomrt.record.store import Store

__all__ = ["Store", "SQLiteStore", "default_store", "loomrt_home"]
