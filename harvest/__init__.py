"""Harvest: the consolidator queue, extraction, placement and durable memory.

Wired by its own issue. ``context.harvest_to_memory`` is accepted and validated now; the
bank registers as an evicted-span callback when the harvest issue lands.
"""

__all__: list[str] = []
