"""Grading an answer against LoCoMo's gold answer, as LoCoMo's own evaluation does.

- **F1**: token-level F1 after normalisation (lower case, punctuation and the articles
  *a, an, the* and the word *and* dropped) and Porter stemming.
- Category 1 (multi-hop): the gold answer and the prediction are split at commas; each
  gold part takes its best F1 against the predicted parts, and the parts are averaged.
- Category 3 (open-domain): only the gold answer's text before the first ``;`` counts.
- Category 5 (adversarial: the conversation holds no answer): 1 if the model abstained
  (its answer says *no information available* or *not mentioned*), else 0.
- **contains**: whether the normalised gold answer appears, word for word, in the
  normalised prediction (category 5: abstention again).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from functools import lru_cache
from typing import Any

__all__ = [
    "normalize_answer",
    "f1",
    "f1_multi",
    "contains",
    "abstained",
    "grade",
    "gold_answer",
    "ABSTENTIONS",
    "answer_words",
    "states_answer",
    "STATES_AT_LEAST",
]

ABSTENTIONS = ("no information available", "not mentioned")
"""The phrases that count as abstaining (LoCoMo's category-5 rule)."""

_ARTICLES = re.compile(r"\b(a|an|the|and)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: object) -> str:
    """Lower case, no punctuation, no articles, single spaces (LoCoMo's normalisation)."""
    s = str(text).lower().replace(",", "")
    s = s.translate(_PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


@lru_cache(maxsize=1)
def _stemmer() -> Any:
    import Stemmer  # PyStemmer, a dependency of recall

    return Stemmer.Stemmer("porter")


def _tokens(text: object) -> list[str]:
    words = normalize_answer(text).split()
    return list(_stemmer().stemWords(words)) if words else []


_FUNCTION_WORDS = frozenset(
    """in on at to of for from with by as or is was were be been it its she he her his him they their them
    i me my we our you your that this who""".split()
)
STATES_AT_LEAST = 0.75
"""The share of the gold answer's content words a retrieved text must hold to state it."""


def answer_words(truth: object, category: int = 0) -> set[str]:
    """The gold answer's content words (stemmed, normalised, function words dropped); for
    category 3 only the text before the first ``;``, as :func:`grade` reads it."""
    gold = str(truth).split(";")[0] if category == 3 else str(truth)
    return {w for w in _tokens(gold) if w not in _FUNCTION_WORDS}


def states_answer(text: object, truth: object, category: int = 0, *, at_least: float = STATES_AT_LEAST) -> bool:
    """Whether ``text`` states the gold answer: it holds at least ``at_least`` of the
    answer's content words. False when the answer has none (it cannot be told apart from
    any text), so callers count those questions apart."""
    words = answer_words(truth, category)
    if not words:
        return False
    held = set(_tokens(text))
    return len(words & held) / len(words) >= at_least


def f1(prediction: object, truth: object) -> float:
    """Token-level F1 of ``prediction`` against ``truth`` (stemmed, normalised)."""
    pred, gold = _tokens(prediction), _tokens(truth)
    same = sum((Counter(pred) & Counter(gold)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def f1_multi(prediction: object, truth: object) -> float:
    """Multi-hop F1: each comma-separated gold part against its best predicted part, averaged."""
    preds = [p for p in str(prediction).split(",") if p.strip()] or [""]
    golds = [g for g in str(truth).split(",") if g.strip()]
    if not golds:
        return 0.0
    return sum(max(f1(p, g) for p in preds) for g in golds) / len(golds)


def contains(prediction: object, truth: object) -> bool:
    """Whether the normalised gold answer appears in the normalised prediction, on word boundaries."""
    gold, pred = normalize_answer(truth), normalize_answer(prediction)
    return bool(gold) and f" {gold} " in f" {pred} "


def abstained(prediction: object) -> bool:
    """Whether the answer says the conversation does not hold one."""
    text = str(prediction).lower()
    return any(a in text for a in ABSTENTIONS)


def gold_answer(question: dict[str, Any]) -> str:
    """The gold answer of a LoCoMo question (category 5 has none: its ``adversarial_answer``
    is the trap, not the answer)."""
    if int(question.get("category", 0)) == 5:
        return "No information available"
    return str(question.get("answer", ""))


def grade(category: int, prediction: str, truth: object) -> dict[str, Any]:
    """``{"f1": float, "contains": bool}`` for one answer, by LoCoMo's rules for ``category``."""
    if category == 5:
        ok = abstained(prediction)
        return {"f1": 1.0 if ok else 0.0, "contains": ok}
    gold = str(truth)
    if category == 3:
        gold = gold.split(";")[0].strip()
    score = f1_multi(prediction, gold) if category == 1 else f1(prediction, gold)
    return {"f1": round(score, 4), "contains": contains(prediction, gold)}
