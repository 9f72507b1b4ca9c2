"""``loomrt memory calibrate``: the merge band, measured for the configured embedder.

Two shipped sets of statement pairs: paraphrases (one fact, two wordings: these should
merge) and non-paraphrases (hard ones: the same person with another fact, the same fact
about another person, the same subject with another value: these must not). The band is
the cosine threshold with which placement (the cosine and its check that the exact values
agree) sorts the pairs best.
"""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

from loomrt.harvest.placement import Candidate, place
from loomrt.recall.embedders import Embedder

__all__ = ["PARAPHRASES", "OTHERS", "calibrate"]

PARAPHRASES: list[tuple[str, str]] = [
    ("Priya prefers tea to coffee.", "Priya likes tea more than coffee."),
    ("Tomás works as a nurse at the city hospital.", "Tomás is a nurse at the city hospital."),
    ("Lena's daughter is called Mia.", "Lena has a daughter named Mia."),
    ("Omar is allergic to peanuts.", "Omar has a peanut allergy."),
    ("The team decided to deploy on Thursdays only.", "The team agreed that deployments happen only on Thursdays."),
    ("Keiko moved to Osaka in 2021.", "In 2021 Keiko relocated to Osaka."),
    ("Dev wants reports as PDF files.", "Dev prefers to receive reports in PDF format."),
    ("Ana plays the cello in a community orchestra.", "Ana is a cellist in a community orchestra."),
    ("The API must not be called more than 100 times a minute.", "Calls to the API are limited to 100 per minute."),
    ("Jonas is vegetarian.", "Jonas does not eat meat; he is a vegetarian."),
    ("Fatima's favourite author is Toni Morrison.", "Fatima likes Toni Morrison best of all authors."),
    ("Marco adopted a dog named Biscuit.", "Marco has an adopted dog called Biscuit."),
    ("Sofia runs a small bakery in Porto.", "Sofia owns and runs a little bakery in Porto."),
    ("Wei is learning Spanish for a trip to Mexico.", "Wei studies Spanish because he is travelling to Mexico."),
    ("The project uses PostgreSQL 15 in production.", "Production runs on PostgreSQL 15 for the project."),
    (
        "Grace volunteers at an animal shelter on weekends.",
        "On weekends Grace does volunteer work at an animal shelter.",
    ),
    ("Hugo's birthday is on 14 March.", "Hugo was born on 14 March."),
    ("Nadia prefers to be called Nad.", "Nadia likes people to call her Nad."),
    ("Ravi finished a marathon in Berlin.", "Ravi completed the Berlin marathon."),
    ("Elif is afraid of flying.", "Elif has a fear of flying."),
]
"""One fact, two wordings."""

OTHERS: list[tuple[str, str]] = [
    ("Priya prefers tea to coffee.", "Priya prefers the window seat on trains."),
    ("Tomás works as a nurse at the city hospital.", "Tomás's sister works as a nurse at the city hospital."),
    ("Lena's daughter is called Mia.", "Lena's son is called Max."),
    ("Omar is allergic to peanuts.", "Omar is allergic to cats."),
    ("The team decided to deploy on Thursdays only.", "The team decided to freeze deployments in December."),
    ("Keiko moved to Osaka in 2021.", "Keiko moved to Osaka in 2019."),
    ("Dev wants reports as PDF files.", "Dev wants reports every Monday morning."),
    ("Ana plays the cello in a community orchestra.", "Ana plays the violin in a jazz band."),
    (
        "The API must not be called more than 100 times a minute.",
        "The API must not be called more than 10 times a minute.",
    ),
    ("Jonas is vegetarian.", "Jonas's partner is vegetarian."),
    ("Fatima's favourite author is Toni Morrison.", "Fatima's favourite film is Spirited Away."),
    ("Marco adopted a dog named Biscuit.", "Marco adopted a cat named Pepper."),
    ("Sofia runs a small bakery in Porto.", "Sofia runs a small bookshop in Lisbon."),
    ("Wei is learning Spanish for a trip to Mexico.", "Wei is learning to swim for a trip to Thailand."),
    ("The project uses PostgreSQL 15 in production.", "The project uses SQLite in its tests."),
    ("Grace volunteers at an animal shelter on weekends.", "Grace works at a bank on weekdays."),
    ("Hugo's birthday is on 14 March.", "Hugo's anniversary is on 2 June."),
    ("Nadia prefers to be called Nad.", "Nadia prefers to work from home."),
    ("Ravi finished a marathon in Berlin.", "Ravi plans to run a marathon in Tokyo."),
    ("Elif is afraid of flying.", "Elif loves sailing."),
]
"""Near misses: these must not merge."""


def _cosines(embedder: Embedder, pairs: list[tuple[str, str]]) -> list[float]:
    a = np.asarray(embedder.embed([p[0] for p in pairs]), dtype=np.float32)
    b = np.asarray(embedder.embed([p[1] for p in pairs]), dtype=np.float32)
    return [float(x) for x in np.sum(a * b, axis=1)]


def _merges(pair: tuple[str, str], cosine: float, threshold: float) -> bool:
    """Whether placement merges the pair's second statement into its first at ``threshold``
    (the same class and subject assumed: the hard case)."""
    subject = pair[0].split()[1] if pair[0].startswith("The ") else pair[0].split()[0].removesuffix("'s")
    return (
        place(
            "fact",
            subject,
            pair[1],
            [Candidate("x", "fact", subject, pair[0], cosine)],
            merge_cosine=threshold,
            supersede_cosine=2.0,
        ).action
        == "merge"
    )


def calibrate(embedder: Embedder | None) -> dict[str, Any]:
    """The cosines of both sets under ``embedder``, and the merge threshold with which
    placement (cosine and the values check) sorts them best."""
    if embedder is None:
        raise ValueError("durable memory has no embedder (lexical-only): there is no cosine band to calibrate")
    same, other = _cosines(embedder, PARAPHRASES), _cosines(embedder, OTHERS)
    best, best_acc = 1.0, -1.0
    for t in sorted(set(same + other)):
        acc = (
            sum(_merges(p, c, t) for p, c in zip(PARAPHRASES, same, strict=True))
            + sum(not _merges(p, c, t) for p, c in zip(OTHERS, other, strict=True))
        ) / (len(same) + len(other))
        if acc > best_acc:  # ties keep the lower threshold: the values check guards the near misses
            best, best_acc = t, acc
    cosine_only = max(
        (sum(c >= t for c in same) + sum(c < t for c in other)) / (len(same) + len(other))
        for t in sorted(set(same + other))
    )

    def summary(xs: list[float]) -> dict[str, float]:
        return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}

    return {
        "embedder": getattr(embedder, "name", type(embedder).__name__),
        "pairs": len(same) + len(other),
        "paraphrase": summary(same),
        "other": summary(other),
        "merge_cosine": round(best, 4),
        "accuracy": round(best_acc, 4),
        "accuracy_cosine_only": round(cosine_only, 4),
    }
