"""Hits at each k over questions, overall and by category (:class:`Tally`), as rates
(:func:`rates`), and the best-first texts that fit a budget of tokens (:func:`within`): the
counting that ``bench recall``, ``bench harvest`` and their accuracy-against-tokens curves share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["Tally", "rates", "within"]


def rates(hits: dict[int, int], n: int) -> dict[str, float]:
    """Hits at each k as shares of ``n`` questions, keyed by ``str(k)`` (0.0 when ``n`` is 0)."""
    return {str(k): round(v / n, 4) if n else 0.0 for k, v in hits.items()}


class Tally:
    """Hits at each k over questions, overall and by category."""

    def __init__(self, ks: Sequence[int]) -> None:
        self.ks = list(ks)
        self.n = 0
        self.hits = {k: 0 for k in ks}
        self.by_cat: dict[int, dict[str, Any]] = {}

    def add(self, category: int, found: Sequence[bool]) -> None:
        """One question: ``found[i]`` says whether it was found at the i-th k."""
        cat = self.by_cat.setdefault(category, {"questions": 0, "hits": {k: 0 for k in self.ks}})
        cat["questions"] += 1
        self.n += 1
        for k, hit in zip(self.ks, found, strict=True):
            if hit:
                self.hits[k] += 1
                cat["hits"][k] += 1

    def add_figures(self, figures: dict[str, Any]) -> None:
        """Add another tally's :meth:`figures` (rates are exact to 4 places, so counts come back whole)."""
        self.n += figures["questions"]
        for k in self.ks:
            self.hits[k] += round(figures["recall_at"][str(k)] * figures["questions"])
        for c, v in figures.get("by_category", {}).items():
            cat = self.by_cat.setdefault(int(c), {"questions": 0, "hits": {k: 0 for k in self.ks}})
            cat["questions"] += v["questions"]
            for k in self.ks:
                cat["hits"][k] += round(v["recall_at"][str(k)] * v["questions"])

    def figures(self, names: dict[int, str]) -> dict[str, Any]:
        return {
            "questions": self.n,
            "recall_at": rates(self.hits, self.n),
            "by_category": {
                str(c): {
                    "name": names.get(c, str(c)),
                    "questions": v["questions"],
                    "recall_at": rates(v["hits"], v["questions"]),
                }
                for c, v in sorted(self.by_cat.items())
            },
        }


def within(texts: Sequence[str], budget: int) -> str:
    """The best-first ``texts`` that fit ``budget`` tokens together (whole texts only)."""
    from loomrt.tokens import count_text

    kept, used = [], 0
    for text in texts:
        used += count_text(text) + 1
        if used > budget:
            break
        kept.append(text)
    return " ".join(kept)
