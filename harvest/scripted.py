"""Model-free extractors for deterministic tests and the load benchmark (never the product's).

- :func:`echo_extractor`: each user line it is sent becomes one fact, verbatim (so a test can
  count facts against spans: 0 lost, 0 doubled); its subject is the line's first name (a
  capitalised word of 3+ letters that is not a function word, a month or a day), else its
  first word, as :func:`subject_of` reads it.
- :func:`coreference_extractor`: like a careful reader with no world knowledge: a line that
  begins with a pronoun becomes a fact about the last name the call's own text mentioned
  before it; with no such name, the pronoun stays (and the fact is dropped as unresolved).
  Whole-batch extraction keeps what per-span extraction loses because of what the
  extractor is *sent*, which is what the tests assert.
- :func:`inventing_extractor`: sabotage of verified facts: the echo, with a year nobody
  said added to every statement (each must be rejected, and counted).
- :func:`repeating_extractor`: sabotage of distinct extraction: the echo, each statement
  written three times (again, then in upper case), as a small model repeats itself.
"""

from __future__ import annotations

import json
import re
from typing import Any

from loomrt.harvest.extract import FIRST_PERSON
from loomrt.providers.base import ModelRequest
from loomrt.providers.scripted import FunctionProvider

__all__ = [
    "echo_extractor",
    "silent_extractor",
    "coreference_extractor",
    "inventing_extractor",
    "repeating_extractor",
    "conversation_lines",
    "speakers",
    "subject_of",
]

_LINE = re.compile(r"^\[(\d+)\] (user|assistant)(?: \(([^)]*)\))?: (.*)$")
_NAME = re.compile(r"(?<![.!?]\s)(?<!^)\b([A-Z][a-z]{2,})\b")
_PRONOUN = re.compile(r"^(She|He|They)\b\s+(.*)$")
_NOT_NAMES = {
    "The",
    "This",
    "That",
    "Then",
    "She",
    "They",
    "His",
    "Her",
    "And",
    "But",
    "When",
    "What",
    "Yes",
    "Our",
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
}


def conversation_lines(request: ModelRequest) -> list[tuple[int, str, str]]:
    """(n, role, text) of each numbered conversation line in an extraction request."""
    text = request.messages[-1]["content"]
    return [(int(m.group(1)), m.group(2), m.group(4)) for line in text.splitlines() if (m := _LINE.match(line))]


def speakers(request: ModelRequest) -> dict[int, str]:
    """Who said each numbered line of an extraction request, where the line names them."""
    text = request.messages[-1]["content"]
    return {int(m.group(1)): m.group(3) for line in text.splitlines() if (m := _LINE.match(line)) and m.group(3)}


_WORD_NAME = re.compile(r"\b([A-Z][a-z]{2,})\b")


def subject_of(text: str) -> str:
    """Whom ``text`` is about, read without world knowledge: its first name (a capitalised
    word of 3+ letters, not a function word, a month or a day), else its first word."""
    names = [w for w in _WORD_NAME.findall(text) if w not in _NOT_NAMES]
    return names[0] if names else (text.split() or ["x"])[0]


def _echo(request: ModelRequest) -> str:
    said_by = speakers(request)

    def statement(n: int, text: str) -> str:  # a line in the first person is quoted, and who said it named
        return f"{said_by[n]} said: “{text}”" if n in said_by and FIRST_PERSON.search(text) else text

    facts = [
        {"statement": statement(n, text), "class": "fact", "subject": subject_of(text), "source_seqs": [n]}
        for n, role, text in conversation_lines(request)
        if role == "user" and len(text) >= 8
    ]
    return json.dumps({"facts": facts})


def echo_extractor() -> FunctionProvider:
    """Every user line becomes one fact, verbatim."""
    return FunctionProvider(_echo, name="scripted/echo-extractor")


def silent_extractor() -> FunctionProvider:
    """States no fact: memory holds the passages alone (the passage tier, measured without a model)."""
    return FunctionProvider(lambda _request: json.dumps({"facts": []}), name="scripted/silent-extractor")


def _inventing(request: ModelRequest) -> str:
    facts = json.loads(_echo(request))["facts"]
    return json.dumps({"facts": [{**f, "statement": f["statement"].rstrip(".!?") + " in 1987."} for f in facts]})


def inventing_extractor() -> FunctionProvider:
    """The echo extractor with an invented value (a year) in every statement."""
    return FunctionProvider(_inventing, name="scripted/inventing-extractor")


def _repeating(request: ModelRequest) -> str:
    facts = json.loads(_echo(request))["facts"]
    return json.dumps({"facts": [x for f in facts for x in (f, f, {**f, "statement": f["statement"].upper()})]})


def repeating_extractor() -> FunctionProvider:
    """The echo extractor with each statement made three times in its reply."""
    return FunctionProvider(_repeating, name="scripted/repeating-extractor")


def _coreference(request: ModelRequest) -> str:
    facts: list[dict[str, Any]] = []
    last_name: str | None = None
    for n, role, text in conversation_lines(request):
        if role != "user":
            continue
        m = _PRONOUN.match(text)
        if m:
            subject = last_name or m.group(1)
            facts.append(
                {"statement": f"{subject} {m.group(2)}", "class": "fact", "subject": subject, "source_seqs": [n]}
            )
        names = [w for w in _NAME.findall(text) if w not in _NOT_NAMES]
        if names:
            last_name = names[-1]
    return json.dumps({"facts": facts})


def coreference_extractor() -> FunctionProvider:
    """Resolves a leading pronoun to the last name the call's own text mentioned."""
    return FunctionProvider(_coreference, name="scripted/coreference-extractor")
