"""Retention modes: one module each (append, recap, stateful, compaction), all one shape."""
