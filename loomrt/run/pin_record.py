"""An operator's pins, written to a run's record out of band (``loomrt runs pin`` / ``unpin``).

Apart from :mod:`loomrt.run.pins` (what a pin is, and the Pin tool), which the projection
reads: these read the projection.
"""

from __future__ import annotations

from loomrt.record.owners import append_out_of_band
from loomrt.record.store import Store
from loomrt.run.pins import Pin, PinError, check_pin, pin_payload
from loomrt.run.projection import project
from loomrt.spec import ContextSpec

__all__ = ["pin_in_record", "unpin_in_record"]


def pin_in_record(store: Store, run_id: str, *, seq: int, note: str = "") -> Pin:
    """An operator's pin of record message ``seq`` (``loomrt runs pin``), appended to the
    record out of band: a run playing elsewhere takes it in at its next event."""
    events = store.events(run_id)
    view = project(events, store=store)
    context = (events[0].data.get("definition") or {}).get("context") or {}
    limit = int(context.get("pins_max_tokens", ContextSpec.model_fields["pins_max_tokens"].default))
    made = check_pin(view, seq=seq, text=None, limit=limit, run_id=run_id)
    append_out_of_band(store, run_id, "pin", pin_payload(made, note=note, by="operator"))
    return made


def unpin_in_record(store: Store, run_id: str, pin_id: str) -> None:
    """End pin ``pin_id`` (``#SEQ`` or ``text-N``) of run ``run_id``."""
    view = project(store.events(run_id), store=store)
    if pin_id not in view.pins:
        held = ", ".join(view.pins) or "none"
        raise PinError(f"run {run_id} has no pin {pin_id} (its pins: {held})")
    append_out_of_band(store, run_id, "unpin", {"pin": pin_id, "by": "operator"})
