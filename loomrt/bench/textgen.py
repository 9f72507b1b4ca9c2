"""Deterministic text for the benchmark workloads: prose of a given token size, planted facts.

Everything here is a pure function of a :class:`random.Random` seeded by the caller, so a
workload generated twice from the same seed is the same to the token.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from loomrt.tokens import count_text

__all__ = ["Fact", "prose", "make_facts", "system_prompt"]

_SUBJECTS = [
    "the garden",
    "our team",
    "the new kitchen",
    "my morning routine",
    "the weekend trip",
    "the budget",
    "the school play",
    "the quarterly review",
    "the bike repair",
    "the book club",
    "the rental car",
    "the neighbours",
    "the hiking route",
    "the birthday dinner",
    "the tax forms",
    "the piano lessons",
    "the move to the coast",
    "the community fair",
    "the old laptop",
    "the vegetable patch",
]
_VERBS = [
    "took longer than planned",
    "went better than expected",
    "needs another look",
    "is finally settled",
    "keeps coming up",
    "turned into a long discussion",
    "was postponed twice",
    "surprised everyone",
    "is mostly done",
    "still has a few loose ends",
    "made me rethink the plan",
    "cost a bit more than hoped",
]
_TAILS = [
    "so I want to keep track of what we decided.",
    "and I am not sure what the next step should be.",
    "which is why I keep writing things down.",
    "and the details matter more than they seem.",
    "but it should be easier once the weather turns.",
    "and I promised to report back by Friday.",
    "so let us think it through calmly.",
    "and everyone had an opinion about it.",
    "which reminded me of last spring.",
    "so a short checklist would help.",
]
_ADVICE = [
    "One option is to split the work into smaller steps and check each one before moving on.",
    "It usually helps to write down the constraints first, then look at the choices that remain.",
    "A simple schedule with two fixed checkpoints tends to keep this kind of plan on track.",
    "If the cost is the worry, compare the two cheapest options side by side before deciding.",
    "Asking the people involved what they need most often settles the question quickly.",
    "Keeping a short log of what changed and why makes the next review much easier.",
    "When in doubt, pick the reversible choice and revisit it after a week.",
    "A quick call is often faster than a long thread of messages for a decision like this.",
]

_OWNERS: list[tuple[str, str]] = [
    # (how the fact is stated, how it is asked about later: a paraphrase sharing one word)
    ("my sister Ana", "Ana"),
    ("my landlord", "the landlord"),
    ("the Halden project", "Halden"),
    ("my dentist", "the dentist"),
    ("my neighbour Tomas", "Tomas"),
    ("the book club", "the club"),
    ("my manager Priya", "Priya"),
    ("the rental agency", "the agency"),
    ("my cousin Leo", "Leo"),
    ("the football team", "the team"),
]
_THINGS: list[tuple[str, str, str]] = [
    # (the thing, how it is asked about: a paraphrase sharing one word, the kind of value)
    ("booking reference", "reference for the reservation", "ref"),
    ("door code", "code to get in", "code"),
    ("account number", "account digits", "num"),
    ("meeting room", "room we meet in", "room"),
    ("backup folder", "folder the backups go to", "path"),
    ("contact person", "person to get in touch with", "name"),
]
_FIRST = ["Ingrid", "Mateo", "Yusuf", "Keiko", "Bartosz", "Olena", "Rafael", "Sunniva", "Dmitri", "Amara"]
_LAST = ["Halvorsen", "Quintero", "Okafor", "Lindqvist", "Marchetti", "Nakamura", "Brennan", "Vasquez"]


@dataclass(frozen=True)
class Fact:
    """One planted fact: stated once early, asked about later (in other words), found again by its ``value``."""

    key: str
    """What the fact is about, e.g. ``"my landlord's door code"``."""
    value: str
    """The exact value, unique in the workload (the needle)."""
    asked: str = ""
    """The paraphrase the question uses, e.g. ``"the landlord's code to get in"``: it shares
    only the owner's name and one word of the thing with the statement."""
    style: int = 0
    """How the fact is stated: 0 says to note it; 1 and 2 mention it in passing."""

    @property
    def statement(self) -> str:
        if self.style == 1:
            return f"It turns out {self.key} is {self.value}, which I had forgotten."
        if self.style == 2:
            return f"By the way, {self.key} changed to {self.value} last month."
        return f"Please note that {self.key} is {self.value}."

    @property
    def question(self) -> str:
        return f"Remind me: what was {self.asked or self.key}?"


def _value(kind: str, rng: random.Random) -> str:
    if kind == "ref":
        return f"{rng.choice('BCDFGHJKLMNPQRSTVWXZ')}{rng.choice('BCDFGHJKLMNPQRSTVWXZ')}-{rng.randint(10000, 99999)}"
    if kind == "code":
        return f"{rng.randint(1000, 9999)}#{rng.randint(10, 99)}"
    if kind == "num":
        return f"{rng.randint(100, 999)}-{rng.randint(1000, 9999)}-{rng.randint(10, 99)}"
    if kind == "room":
        return f"room {rng.choice(['K', 'L', 'M', 'N'])}{rng.randint(100, 499)}"
    if kind == "path":
        return (
            f"/srv/backups/{rng.choice(['orchid', 'falcon', 'juniper', 'cobalt'])}-{rng.randint(100, 999)}/snapshot.tar"
        )
    return f"{rng.choice(_FIRST)} {rng.choice(_LAST)}-{rng.randint(2, 9)}"


def make_facts(n: int, rng: random.Random) -> list[Fact]:
    """``n`` facts with distinct keys and distinct values (at most 60); one in three is stated as one to note."""
    pairs = [(o, t) for o in _OWNERS for t in _THINGS]
    rng.shuffle(pairs)
    facts: list[Fact] = []
    seen: set[str] = set()
    for i, ((owner, owner_asked), (thing, thing_asked, kind)) in enumerate(pairs[:n]):
        value = _value(kind, rng)
        while value in seen:
            value = _value(kind, rng)
        seen.add(value)
        facts.append(Fact(f"{owner}'s {thing}", value, f"{owner_asked}'s {thing_asked}", style=i % 3))
    return facts


def prose(tokens: int, rng: random.Random, *, advice: bool = False) -> str:
    """Chat-like prose of about ``tokens`` tokens (cl100k), never shorter."""
    out: list[str] = []
    size = 0
    while size < tokens:
        if advice:
            sentence = rng.choice(_ADVICE)
        else:
            sentence = f"{rng.choice(_SUBJECTS).capitalize()} {rng.choice(_VERBS)}, {rng.choice(_TAILS)}"
        out.append(sentence)
        size += count_text(sentence) + 1
    return " ".join(out)


def system_prompt(tokens: int, rng: random.Random, *, role: str) -> str:
    """A system prompt of about ``tokens`` tokens: a role line, then numbered house rules."""
    lines = [f"You are {role}. Be accurate, brief and kind. Follow the house rules below."]
    i = 1
    while count_text("\n".join(lines)) < tokens:
        lines.append(f"{i}. {rng.choice(_ADVICE)} {rng.choice(_TAILS).capitalize()}")
        i += 1
    return "\n".join(lines)
