"""Verified cards: every exact value a leaf card states must occur verbatim in its source.

A summariser that writes "port 5433" for a transcript that said 5432 has made the card
worse than no card: the model trusts it. So a leaf card's numbers, dates, times, paths,
identifiers and quoted strings are found in it and looked up, character for character,
in the transcript it summarises; a card with one that is not there is rejected (and
written again, then replaced by a marked fallback). ``[#seq]`` pointers are checked
elsewhere (:func:`loomrt.run.reducers.summarize.keep_pointers`). The values are read by
:mod:`loomrt.exact`, which harvest's verified facts share.
"""

from __future__ import annotations

from loomrt.exact import invented, values

__all__ = ["values", "invented"]
