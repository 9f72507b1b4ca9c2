"""Extraction: the one step of consolidation that calls a model.

The extractor sees the conversation only (:func:`parts_of`): numbered lines of user inputs
and assistant replies, tool results as short labelled excerpts, and a date line where the
date changes, never the system prompt, tool JSON, run ids or record headers. A batch is
extracted as a whole, so a subject named two spans earlier is still known when a later span
says "she". The reply must follow :data:`REPLY_SCHEMA` (constrained JSON on local models);
:func:`parse_reply` tells apart nothing worth keeping (``[]``), an unparseable reply, and
facts, and :func:`check_fact` drops and counts what must never be stored.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from loomrt.harvest.dates import absolute_dates
from loomrt.harvest.evidence import stored_line, unsupported
from loomrt.harvest.passages import said_words
from loomrt.harvest.redact import has_secret
from loomrt.tokens import count_text

__all__ = [
    "MAX_FACTS",
    "Line",
    "parts_of",
    "extraction_messages",
    "REPLY_SCHEMA",
    "parse_reply",
    "repeats_a_statement",
    "complete_items",
    "Unparseable",
    "check_fact",
    "distinct",
    "FIRST_PERSON",
    "absolute_dates",
    "EXTRACT_PROMPT",
    "ExtractedFact",
]

CLASSES = ["preference", "fact", "decision", "identity", "constraint", "correction"]

MAX_FACTS = 10
"""Facts one reply may hold. Ten facts of a sentence each fit the reply's 1,024 tokens; with
15 allowed, every LoCoMo batch's first reply from the embedded model ran to the cap (it
repeated itself) and was cut off (docs/memory.md)."""

REPLY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "facts": {
            "type": "array",
            "maxItems": MAX_FACTS,
            "items": {
                "type": "object",
                "properties": {  # in the order the model writes them (a grammar keeps this order)
                    "subject": {"type": "string", "minLength": 1, "maxLength": 120},
                    "statement": {"type": "string", "minLength": 8, "maxLength": 400},
                    "source_seqs": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 6},
                    "class": {"type": "string", "enum": CLASSES},
                    "observed_at": {"type": "string"},
                },
                "required": ["subject", "statement", "source_seqs", "class"],
            },
        },
    },
    "required": ["facts"],
}
"""What the extractor must answer: ``{"facts": [{subject, statement, source_seqs, class, observed_at?}]}``.

The order is the order the embedded model writes an item in (its grammar keeps the schema's
order): the subject first, so the statement names it; the statement before its lines, so the
lines it cites are those of what it wrote (in alphabetical order, as once, the model chose its
lines before it wrote the statement and cited lines 1 to 6 for most facts). ``observed_at``
is not asked for: a fact's date is its last line's (:func:`check_fact`)."""

_ITEM = jsonschema.Draft202012Validator(REPLY_SCHEMA["properties"]["facts"]["items"])

EXTRACT_PROMPT = """You keep the long-term memory of an assistant. Read the conversation below and write down what will still matter in a later conversation: facts about the people in it (what they did, have, plan, like), their preferences, decisions, constraints, identities, and corrections of something said earlier.

Answer with JSON only: {"facts": [...]}, each item {"subject", "statement", "source_seqs", "class"}:
- subject: who or what the statement is about, by name.
- statement: one self-contained sentence in the third person that states one thing and names its subject (no "I", "my", "he", "she", "they", "it", "the user": write the name the conversation gives); two things are two facts. Write every relative time as an absolute date, computed from the date line above it: "yesterday" in a line of 8 May 2023 is "on 7 May 2023", "last Tuesday" is "on 2 May 2023", "next month" is "in June 2023". Copy numbers, names, places and times exactly as the conversation writes them.
- source_seqs: the [n] numbers of the one or two lines that say it.
- class: preference, fact, decision, identity, constraint or correction.
Prefer concrete facts (what happened, names, places, dates, plans, possessions, changes) to opinions and pleasantries. Example: from the line
[4] user (Dana): I started pottery classes last week, it really helps me relax
write {"subject": "Dana", "statement": "Dana started pottery classes in the week of 3 March 2024; they help her relax.", "source_seqs": [4], "class": "fact"}.
Write at most 10 facts, the most important first, each once: every statement must say something no other statement in your answer says. Do not write down that someone asked a question, that a conversation or session took place, or anything about the assistant. If nothing is worth keeping, answer {"facts": []}."""


@dataclass(frozen=True)
class Line:
    """One numbered line the extractor sees, and where it came from."""

    n: int
    text: str
    run_id: str
    seq: int | None
    ts: float | None
    tokens: int
    distillation_seq: int = 0
    """The distillation whose span holds the line."""
    said: str = ""
    """The words of the line, verbatim as banked (without its number, speaker or date)."""
    role: str = "user"
    speaker: str | None = None
    """Who said it (a name, where the record has one; a tool result: the tool)."""


@dataclass(frozen=True)
class ExtractedFact:
    """A fact as the extractor wrote it, checked, its lines mapped back to the record."""

    statement: str
    cls: str
    subject: str
    observed_at: str | None
    lines: tuple[Line, ...] = field(default_factory=tuple)


class Unparseable(ValueError):
    """The reply is not JSON in the contract's shape."""


def _date(ts: float | None) -> str | None:
    return None if ts is None else _dt.datetime.fromtimestamp(ts, tz=_dt.UTC).strftime("%d %B %Y").lstrip("0")


def _who(turn: dict[str, Any]) -> str:
    if turn["role"] == "tool":
        return f"tool result ({turn.get('tool') or 'tool'}), excerpt"
    name = turn.get("speaker")
    return f"{turn['role']} ({name})" if name else turn["role"]


def parts_of(spans: Sequence[dict[str, Any]], *, part_tokens: int, max_parts: int) -> tuple[list[list[Line]], int]:
    """The batch's conversation as numbered lines cut into parts of at most ``part_tokens``
    tokens on message boundaries, and how many earlier parts were left out to keep the
    latest ``max_parts`` (a message longer than a part is a part of its own)."""
    lines: list[Line] = []
    day = None
    for span in spans:
        for turn in span["turns"]:
            stamp = _date(turn.get("ts"))
            prefix = f"(date: {stamp})\n" if stamp and stamp != day else ""
            day = stamp or day
            n = len(lines) + 1
            text = f"{prefix}[{n}] {_who(turn)}: {turn['text']}"
            lines.append(
                Line(
                    n,
                    text,
                    span["run_id"],
                    turn.get("seq"),
                    turn.get("ts"),
                    count_text(text),
                    span["distillation_seq"],
                    said=turn["text"],
                    role=turn["role"],
                    speaker=turn.get("speaker") or turn.get("tool"),
                )
            )
    parts: list[list[Line]] = []
    size = 0
    for line in lines:
        if parts and size + line.tokens <= part_tokens:
            parts[-1].append(line)
            size += line.tokens
        else:
            parts.append([line])
            size = line.tokens
    dropped = max(0, len(parts) - max_parts)
    return parts[dropped:], dropped


def extraction_messages(parts: Sequence[Sequence[Line]]) -> list[dict[str, Any]]:
    """The extraction call: the prompt, then the conversation (every kept part, in order)."""
    conversation = "\n".join(line.text for part in parts for line in part)
    return [
        {"role": "system", "content": EXTRACT_PROMPT},
        {"role": "user", "content": f"Conversation:\n{conversation}\n\nJSON:"},
    ]


_STATEMENT = re.compile(r'"statement"\s*:\s*"((?:[^"\\]|\\.)*)"')


def repeats_a_statement(text: str) -> bool:
    """Whether a reply written so far has begun to repeat itself: a finished ``statement``
    says what an earlier one in it said, word for word (:func:`said_words`). The embedded
    model, once it repeats, mostly goes on repeating to the reply's length limit (18 of a
    LoCoMo run's 28 statements did): the extraction call stops there (``stop_when``), and
    :func:`parse_reply` keeps the items that were complete."""
    seen: set[str] = set()
    for m in _STATEMENT.finditer(text):
        key = said_words(m.group(1))
        if key in seen:
            return True
        seen.add(key)
    return False


def complete_items(raw: str) -> list[Any] | None:
    """The items of a ``{"facts": [...`` reply that was cut off: every item that closed
    before the cut, in order (None if the reply does not open such a list)."""
    m = re.search(r'"facts"\s*:\s*\[', raw)
    if m is None:
        return None
    decoder, i = json.JSONDecoder(), m.end()
    items: list[Any] = []
    while True:
        while i < len(raw) and raw[i] in " \t\r\n,":
            i += 1
        if i >= len(raw) or raw[i] != "{":
            return items
        try:
            item, i = decoder.raw_decode(raw, i)
        except json.JSONDecodeError:
            return items
        items.append(item)


def parse_reply(text: str, *, cut: bool = False) -> list[dict[str, Any]]:
    """The items of a reply: ``[]`` is nothing worth keeping; :class:`Unparseable` when it
    is not JSON of the contract's shape (an item that breaks the contract is left to
    :func:`check_fact`). A ``cut`` reply (stopped early on purpose) gives the items that
    closed before the cut."""
    raw = text.strip()
    fenced = re.search(r"```(?:json)?\s*(.*?)```", raw, re.S)
    if fenced:
        raw = fenced.group(1).strip()
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        salvaged = complete_items(raw) if cut else None
        if salvaged is not None:
            return salvaged
        start = min((i for i in (raw.find("{"), raw.find("[")) if i >= 0), default=-1)
        if start < 0:
            raise Unparseable("the reply holds no JSON") from None
        try:
            data, _ = json.JSONDecoder().raw_decode(raw[start:])
        except json.JSONDecodeError as exc:
            raise Unparseable(f"the reply is not JSON: {exc.msg} at character {exc.pos}") from None
    if isinstance(data, dict) and isinstance(data.get("facts"), list):
        data = data["facts"]
    if not isinstance(data, list):
        raise Unparseable('the reply is JSON but not {"facts": [...]} or a list')
    return data


_META = [
    re.compile(
        r"\b(asked|asks|asking|inquired|wanted to know|wants to know)\b.*\b(about|whether|if|what|how|why|when|where|who)\b",
        re.I,
    ),
    re.compile(
        r"\bthe (assistant|chatbot|AI)\b|\bassistant (said|says|helped|suggested|recommended|provided|explained|answered)\b",
        re.I,
    ),
    re.compile(r"\bthis (conversation|chat|session|run|transcript)\b|\bthe (conversation|chat|transcript)\b", re.I),
    re.compile(r"\b(conversation|session|chat) (took place|happened|occurred|started|ended)\b", re.I),
]
_PRONOUN = re.compile(
    r"^(he|she|they|it|i|you|we|him|her|them|his|hers|their|the user|user|someone)\b(?!['’]s? \w)", re.I
)
FIRST_PERSON = re.compile(
    r"\b(?:I(?!-)|I['’](?:m|ve|d|ll)|me|my|myself|we|us|our|ours|ourselves)\b|^(?:My|Our|We|Me)\b"
)
"""A statement in the first person anywhere outside a quote (a line copied as said). Where
the lines it cites are a named speaker's (people talking to each other), "I" is nobody to a
later reader; in ``Ana said: "I moved"`` it is Ana. (In a user's own chat, whose lines name
no speaker, "my colleague Rosa" is the user's, the memory scope's owner.)"""
_QUOTED = re.compile(r'"[^"]*"|“[^”]*”|‘[^’]*’(?!\w)')
_IDS = [
    re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{12}\b"),
    re.compile(r"\b(run[ _-]?id|seq(uence)?\s*#?\d+|record seq)\b", re.I),
    re.compile(r"\[#?\d+\]|#\d+\b"),
]


def distinct(items: Sequence[Any]) -> tuple[list[Any], int]:
    """The items of one reply with each statement once (the first; a repeat's cited lines
    join it) and each statement's clauses once (:func:`_clauses_once`), and how many repeats
    were dropped. A small model repeats itself within a reply (half of the embedded model's
    LoCoMo statements did, word for word): each is dropped here, before merging, and counted.
    Items without a statement are left to :func:`check_fact`."""
    first: dict[str, int] = {}
    out: list[Any] = []
    clauses = 0
    for item in items:
        said = item.get("statement") if isinstance(item, dict) else None
        if isinstance(said, str):
            said, dropped = _clauses_once(said)
            clauses += dropped
            item = {**item, "statement": said} if dropped else item
        key = said_words(said) if isinstance(said, str) else ""
        if not key:
            out.append(item)
            continue
        if key not in first:
            first[key] = len(out)
            out.append(dict(item))
            continue
        kept = out[first[key]]
        if isinstance(kept.get("source_seqs"), list) and isinstance(item.get("source_seqs"), list):
            kept["source_seqs"] = list(dict.fromkeys([*kept["source_seqs"], *item["source_seqs"]]))[:6]
    return out, len(items) - len(out) + clauses


def _clauses_once(statement: str) -> tuple[str, int]:
    """``statement`` with each of its ``;`` clauses once, and how many were dropped: the
    embedded model also repeats inside one statement ("Cy added a sourdough rye; Dee needs to
    try it; Cy added a sourdough rye; ...", cut off at the length limit mid-clause): a clause
    that repeats an earlier one, or begins one (the cut-off repeat), is dropped."""
    parts = [p.strip() for p in statement.split(";")]
    if len(parts) < 2:
        return statement, 0
    kept: list[str] = []
    seen: list[str] = []
    for part in parts:
        words = said_words(part)
        if words and any(earlier == words or earlier.startswith(words + " ") for earlier in seen):
            continue
        kept.append(part)
        seen.append(words)
    return "; ".join(p for p in kept if p), len(parts) - len(kept)


def check_fact(item: Any, lines: dict[int, Line]) -> tuple[ExtractedFact | None, str]:
    """The fact an item states, or None and why it is dropped: ``invalid`` (breaks the
    contract), ``meta`` (that a question was asked or a run happened), ``ids`` (run or
    record ids), ``secret``, ``unresolved`` (its subject is a pronoun: not self-contained),
    ``unsourced`` (its lines are not in the batch), or ``unverified`` (an exact value of it
    occurs neither in its lines nor in their dates: :func:`~loomrt.harvest.evidence.unsupported`)."""
    if not isinstance(item, dict) or next(_ITEM.iter_errors(item), None) is not None:
        return None, "invalid"
    statement = " ".join(str(item["statement"]).split())
    if any(p.search(statement) for p in _META):
        return None, "meta"
    if any(p.search(statement) for p in _IDS):
        return None, "ids"
    if has_secret(statement) or has_secret(str(item["subject"])):
        return None, "secret"
    if _PRONOUN.match(str(item["subject"]).strip()) or _PRONOUN.match(statement):
        return None, "unresolved"  # "she is a nurse": whose fact, the reader cannot tell
    cited = tuple(lines[n] for n in dict.fromkeys(item["source_seqs"]) if n in lines)
    if not cited:
        return None, "unsourced"
    if any(line.role == "user" and line.speaker for line in cited) and FIRST_PERSON.search(_QUOTED.sub(" ", statement)):
        return None, "unresolved"  # "the group made me feel accepted", of named speakers: which one?
    if unsupported(statement, [stored_line(line) for line in cited]):
        return None, "unverified"  # "port 5433" from a line that said 5432: worse than no fact
    statement = absolute_dates(statement, cited[-1].ts)  # its own "yesterday": resolved here, not invented
    observed = item.get("observed_at") or None
    if observed is not None and not re.fullmatch(r"\d{4}-\d{2}-\d{2}.*", str(observed)):
        observed = None
    if observed is None and cited[-1].ts is not None:
        observed = _dt.datetime.fromtimestamp(cited[-1].ts, tz=_dt.UTC).strftime("%Y-%m-%d")
    return ExtractedFact(statement, str(item["class"]), " ".join(str(item["subject"]).split()), observed, cited), ""
