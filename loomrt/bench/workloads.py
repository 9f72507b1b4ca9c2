"""The generated workloads: ``chat200`` (a long chat with planted facts) and ``agentic``
(a long tool-using run with needles in tool results of varied size).

Both are generated from the config's seed, so every mode sees exactly the same inputs, and
played by :func:`loomrt.bench.play.play_mode`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loomrt.bench.core import BenchConfig, ModeRun, Probe, Progress, WorkloadResult, workload
from loomrt.bench.model import BenchModel, Needle, newest
from loomrt.bench.play import bench_spec, play_mode
from loomrt.bench.reader import lines_of, value_after_key
from loomrt.bench.textgen import make_facts, prose, system_prompt
from loomrt.providers.base import ModelRequest, ModelResponse
from loomrt.run.between_turns import between_turns
from loomrt.run.state import RunState
from loomrt.runtime import Runtime
from loomrt.tokens import count_text
from loomrt.tools import Tool

__all__ = [
    "turn_input",
    "chat_script",
    "agentic_script",
    "ChatTurn",
    "ChatCue",
    "play_chat",
    "Step",
    "Move",
    "NEEDED",
    "grade_plan",
    "with_append",
    "ChatModel",
    "chat200",
    "chat200_lead",
    "raise_failed",
    "agentic_tools",
    "AgenticModel",
    "agentic",
    "play_agentic",
    "needle_service",
    "agentic_needle",
    "NeedleMaker",
    "Planter",
]


def with_append(modes: list[str]) -> list[str]:
    return ["append", *[m for m in modes if m != "append"]]


# ---------------------------------------------------------------------- chat200


@dataclass(frozen=True)
class ChatCue:
    """What the model is told of a turn: the question sentence it answers (empty if the turn
    asks none) and its fixed reply. Never the turn's text (it reads that in its prompt) nor
    the fact the turn asks about: the workload keeps the gold value and grades the reply."""

    question: str = ""
    reply: str = ""


@dataclass(frozen=True)
class ChatTurn:
    text: str
    reply: str
    asks: Needle | None = None
    """The fact this turn asks about (its gold value grades the reply; the model never sees it)."""
    question: str = ""
    """The question sentence of the turn (in ``text``): what the model answers."""

    @property
    def cue(self) -> ChatCue:
        """What the model is told of this turn."""
        return ChatCue(self.question, self.reply)


def chat_script(
    seed: int, *, turns: int = 200, facts: int = 40, lead_every: int = 0
) -> tuple[str, list[ChatTurn], list[Needle]]:
    """The chat: a ~500-token system prompt and ``turns`` turns of ~300 tokens (user ~120,
    reply ~180). Fact *i* is stated in the first 30% of the turns (one in three as a fact to
    note, the rest in passing) and asked in the last 40%, in other words than it was stated.
    A fact is stated after ~60 tokens of prose, where no summary that keeps a message's
    leading sentence keeps it; with ``lead_every`` N, every N-th fact (the first, the
    N+1-th, …) opens its message instead, where an extractive summary can keep it."""
    rng = random.Random(seed)
    planted = make_facts(facts, rng)
    if len(planted) < facts:
        raise ValueError(f"chat_script: {facts} facts asked, the generator has {len(planted)}")
    needles = [Needle(f.key, f.value, f.question) for f in planted]
    system = system_prompt(500, rng, role="a personal assistant who keeps track of what the user says")
    stated = {1 + (i * max(1, int(turns * 0.3) - 1)) // facts: i for i in range(facts)}
    first_q = int(turns * 0.6)
    asked = {first_q + (i * (turns - first_q - 1)) // facts: i for i in range(facts)}
    script: list[ChatTurn] = []
    for t in range(turns):
        reply = prose(170, rng, advice=True)
        if t == 0:
            text = "Hi! Over the next weeks I will tell you about my plans and errands; keep track of them for me. "
            script.append(ChatTurn(text + prose(95, rng), reply))
        elif t in asked:
            f = planted[asked[t]]
            script.append(ChatTurn(f"{f.question} {prose(105, rng)}", reply, needles[asked[t]], f.question))
        elif t in stated:
            f = planted[stated[t]]
            if lead_every and stated[t] % lead_every == 0:
                script.append(ChatTurn(f"{f.statement} {prose(105, rng)}", reply))
            else:
                script.append(ChatTurn(f"{prose(60, rng)} {f.statement} {prose(45, rng)}", reply))
        else:
            script.append(ChatTurn(prose(120, rng), reply))
    return system, script, needles


_NOTE_CUES = ("note", "remember", "keep track")


def turn_input(request: ModelRequest) -> str:
    """The user's input the newest message of a prompt holds ("" if it holds none: a tool
    result, or a stateful run's last observation)."""
    _, last = newest(request.messages)
    content = str(last.get("content") or "")
    return content if last.get("role") == "user" and not content.startswith("Last observation (") else ""


@dataclass
class ChatModel(BenchModel):
    """Answers the turn the workload cued in ``current``: its fixed reply, headed by the line
    it answers the turn's question from (:meth:`BenchModel.look_up`), if it asks one. In
    stateful mode it notes in Σ each sentence of the user's input that asks it to note.
    It is told no gold value: the workload grades its reply."""

    current: ChatCue | None = None

    def turn(self, request: ModelRequest) -> ModelResponse:
        t = self.current
        assert t is not None
        head = "Noted."
        if t.question:
            line, recall = self.look_up(request, t.question, t.question, asked_in=t.question)
            if recall is not None:
                return recall
            head = f"You told me: {line}" if line else "I am not sure: I no longer have that detail."
        return self.act(request, text=f"{head} {t.reply}")

    def worth_noting(self, request: ModelRequest) -> dict[str, str]:
        t = self.current
        if t is None:
            return {}
        said = [s for s in lines_of([turn_input(request)]) if any(c in s.lower() for c in _NOTE_CUES)]
        return {f"said {len(self.patched) + i + 1}": s for i, s in enumerate(said)}


@workload("chat200", "a 200-turn chat: ~300-token turns, 40 facts stated early and asked late")
def chat200(config: BenchConfig, progress: Progress) -> WorkloadResult:
    """Every mode plays the same chat as an interactive run; facts are probed at the end."""
    turns, facts = (60, 12) if config.quick else (200, 40)
    return play_chat(config, progress, turns=turns, facts=facts)


@workload(
    "chat200_lead",
    "chat200 with every other fact stated in its message's leading sentence, where an extractive summary can keep it",
)
def chat200_lead(config: BenchConfig, progress: Progress) -> WorkloadResult:
    """chat200 whose "no-recall" rows measure what the summaries keep: in chat200 every fact
    sits after ~60 tokens of prose, where a summary of leading sentences keeps none."""
    turns, facts = (60, 12) if config.quick else (200, 40)
    return play_chat(config, progress, turns=turns, facts=facts, name="chat200_lead", lead_every=2)


def play_chat(
    config: BenchConfig,
    progress: Progress,
    *,
    turns: int,
    facts: int,
    label: str = "",
    name: str = "chat200",
    lead_every: int = 0,
) -> WorkloadResult:
    """The chat of ``turns`` turns and ``facts`` facts, played in each of ``config.modes``
    (``lead_every``: see :func:`chat_script`)."""
    system, script, needles = chat_script(config.seed, turns=turns, facts=facts, lead_every=lead_every)
    label = label or name
    result = WorkloadResult(
        name,
        "turn",
        params={
            "turns": turns,
            "facts": facts,
            **({"facts_leading": len(range(0, facts, lead_every))} if lead_every else {}),
            "system_tokens": count_text(system),
            "turn_tokens": round(sum(count_text(t.text) + count_text(t.reply) for t in script) / len(script)),
        },
    )
    probes = [Probe(n.search, (n.value,), n.key) for n in needles]

    async def drive(runtime: Runtime, run: RunState, model: BenchModel | None, out: ModeRun) -> None:
        for t in script:
            if isinstance(model, ChatModel):
                model.current = t.cue  # the turn's question and reply, never what it asks about
            res = await runtime.send(run, t.text)
            progress.advance()
            if res.status == "failed":
                raise_failed(res.error)
            if t.asks is not None:  # graded here, against the gold value the workload keeps
                out.answered.append(t.asks.value in (res.output or ""))
            if t is not script[-1]:  # as `loomrt chat` does while the next input is typed
                await between_turns(run, runtime.coordination)

    for mode in with_append(config.modes):
        progress.start(f"{label} · {mode}", len(script))
        result.runs[mode] = play_mode(
            config,
            mode,
            spec=bench_spec(config, mode, system=system),
            drive=drive,
            probes=probes,
            make_model=lambda: ChatModel(seed=config.seed),
            unit="turn",
            interactive=True,
            local=True,
            name=name,
        )
    return result


def raise_failed(error: str | None) -> None:
    from loomrt.errors import RunError

    raise RunError(error or "the run failed")


# ---------------------------------------------------------------------- agentic

_SERVICES = ["orchard", "ledger", "beacon", "quarry", "tundra", "mosaic"]
_WORDS = ["add_index", "split_orders", "drop_legacy", "backfill_users", "rename_sku", "tighten_fk"]


def needle_service(i: int) -> str:
    """The service needle *i* is about ((kind, service) pairs are distinct up to 36 needles)."""
    return _SERVICES[(i + i // 6) % len(_SERVICES)]


def agentic_needle(i: int, rng: random.Random) -> Needle:
    """Needle *i*: a value of kind ``i % 6`` (a migration path, an error code, a setting, a
    replica host, a release tag, a ticket) for :func:`needle_service` (i), named by its key."""
    kind = i % 6
    svc = needle_service(i)
    if kind == 0:
        v = f"/var/lib/{svc}/migrations/{rng.randint(10, 9999):04d}_{rng.choice(_WORDS)}.sql"
        return Needle(f"the failing migration file of {svc}", v, f"{svc} failing migration file path")
    if kind == 1:
        v = f"E{rng.randint(1000, 9999)}"
        return Needle(f"the error code of the {svc} worker crash", v, f"{svc} worker crash error code")
    if kind == 2:
        v = f"max_connections={rng.randint(101, 999)}"
        return Needle(f"the max_connections setting of {svc}-db", v, f"{svc}-db max_connections setting")
    if kind == 3:
        v = f"db-{rng.choice(['west', 'east', 'north'])}-{rng.randint(2, 40)}.{svc}.internal"
        return Needle(f"the replica of {svc} that lagged", v, f"{svc} lagging replica host")
    if kind == 4:
        v = f"v{rng.randint(1, 9)}.{rng.randint(0, 30)}.{rng.randint(0, 30)}-rc{rng.randint(1, 9)}"
        return Needle(f"the {svc} release that introduced the regression", v, f"{svc} release tag regression")
    v = f"OPS-{rng.randint(10000, 99999)}"
    return Needle(f"the ticket tracking the {svc} outage", v, f"{svc} outage ticket")


def _distractor(svc: str, rng: random.Random) -> str:
    """An ERROR line no step will need (noise a model keeping every error line keeps too)."""
    what, value = rng.choice(
        [
            (f"the retry queue of the {svc} worker", f"{rng.randint(2, 400)} pending"),
            (f"the last healthy build of {svc}", f"b{rng.randint(1000, 9999)}"),
            (f"the disk usage of {svc}-db", f"{rng.randint(60, 99)}%"),
            (f"the slowest query of {svc}", f"q{rng.randint(100, 999)} at {rng.randint(2, 90)}s"),
        ]
    )
    return f"2026-03-1{rng.randint(0, 9)}T0{rng.randint(0, 9)}:{rng.randint(10, 59)}:07Z ERROR {svc}: {what}: {value}"


NEEDED = "{needed}"
"""Where a :class:`Move`'s arguments take the value the model found (the plan never holds the value)."""


@dataclass(frozen=True)
class Move:
    """A step of the plan as the model holds it: the call to make and, for a step that needs
    a value, what the value is (``needs``: the key a line that holds it names) and the words
    it would search it by. Its arguments hold :data:`NEEDED` where the value goes; the value
    itself stays with the workload, which grades the call the model makes."""

    tool: str
    arguments: dict[str, Any]
    needs: str = ""
    query: str = ""


@dataclass(frozen=True)
class Step:
    tool: str
    arguments: dict[str, Any]
    output: str
    needs: Needle | None = None

    @property
    def move(self) -> Move:
        """What the model is told of this step: the call, with :data:`NEEDED` for the value it needs."""
        if self.needs is None:
            return Move(self.tool, dict(self.arguments))
        value = self.needs.value
        args = {k: v.replace(value, NEEDED) if isinstance(v, str) else v for k, v in self.arguments.items()}
        if self.needs.question:  # asked in other words: the model searches by the question as asked
            return Move(self.tool, args, self.needs.question, self.needs.question)
        return Move(self.tool, args, self.needs.key, self.needs.search)


def grade_plan(script: list[Step], calls: list[dict[str, Any]]) -> list[bool]:
    """Whether each step that needs a value was answered right: ``calls`` are the arguments of
    the workload's tool calls in the order made, the *i*-th the call for step *i* (a model
    following the plan makes one per step); a step's call is right if it holds the planned
    arguments, the gold value in place. Steps the run never reached are not graded."""
    return [call == s.arguments for s, call in zip(script, calls, strict=False) if s.needs is not None]


def _log(tokens: int, rng: random.Random, svc: str) -> list[str]:
    lines, size = [], 0
    while size < tokens:
        ln = (
            f"2026-03-{rng.randint(10, 28)}T0{rng.randint(0, 9)}:{rng.randint(10, 59)}:{rng.randint(10, 59)}Z "
            f"{rng.choice(['INFO', 'INFO', 'WARN', 'DEBUG'])} {svc}[{rng.randint(100, 999)}]: {prose(14, rng)}"
        )
        lines.append(ln)
        size += count_text(ln) + 1
    return lines


NeedleMaker = Callable[[int, random.Random], Needle]
"""Needle *i* of an agentic script, its value drawn from the script's generator."""
Planter = Callable[[Needle, str, random.Random], list[str]]
"""The lines a result that states a needle carries (the step's service given): inserted at random places."""


def _error_line(n: Needle, svc: str, rng: random.Random) -> list[str]:
    return [f"2026-03-14T02:11:07Z ERROR {svc}: {n.key}: {n.value}"]


def agentic_script(
    seed: int,
    *,
    steps: int = 150,
    needles: int = 18,
    huge: int = 3,
    needle: NeedleMaker = agentic_needle,
    plant: Planter = _error_line,
) -> tuple[str, str, list[Step], list[Needle]]:
    """A tool-using investigation: ``steps`` tool calls whose results range from ~80 to
    ~1,500 tokens, ``huge`` of ~5,000; needle *i* appears in a result in the first 40% of the
    steps (by default as an ERROR line that names its key: ``plant``) and is needed (as a
    tool argument) in the last 30%. About half the other early results carry an ERROR line
    that is never needed."""
    rng = random.Random(seed + 1)
    planted = [needle(i, rng) for i in range(needles)]
    system = system_prompt(400, rng, role="a site-reliability agent that investigates incidents with tools")
    task = (
        "The nightly deploy fails across several services. Investigate with the tools, fix what you can, "
        "and report the root cause with the exact paths, error codes and values you relied on."
    )
    early = int(steps * 0.4)
    stated = {2 + (i * (early - 3)) // needles: i for i in range(needles)}
    late = int(steps * 0.7)
    needed = {late + (i * (steps - late - 1)) // needles: i for i in range(needles)}
    huge_at: set[int] = set()
    for f in (0.15, 0.5, 0.85)[:huge]:
        at = int(steps * f)
        while at in needed or at in huge_at:
            at += 1
        huge_at.add(at)
    script: list[Step] = []
    for s in range(steps):
        svc = _SERVICES[s % len(_SERVICES)]
        if s in needed:
            n = planted[needed[s]]
            script.append(
                Step(
                    "run_command",
                    {"cmd": f"grep -rn '{n.value}' /etc /var/log | head"},
                    "\n".join(_log(120, rng, svc)),
                    n,
                )
            )
            continue
        size = 5000 if s in huge_at else (rng.randint(400, 1500) if rng.random() < 0.25 else rng.randint(80, 400))
        lines = _log(size, rng, svc)
        if s in stated:
            for line in plant(planted[stated[s]], svc, rng):
                lines.insert(rng.randint(0, len(lines)), line)
        elif s < early and rng.random() < 0.5:
            lines.insert(rng.randint(0, len(lines)), _distractor(svc, rng))
        tool = ["run_command", "open_file", "search_logs"][s % 3]
        arg = {
            "run_command": {"cmd": f"journalctl -u {svc} --since -{s + 1}h | tail -n {size // 10}"},
            "open_file": {"path": f"/var/log/{svc}/deploy-{s}.log"},
            "search_logs": {"query": f"{svc} deploy step {s}"},
        }[tool]
        script.append(Step(tool, arg, "\n".join(lines)))
    return system, task, script, planted


def agentic_tools(script: list[Step]) -> list[Tool]:
    """The workload's tools: each answers its planned call with the planned output."""
    table = {(s.tool, json.dumps(s.arguments, sort_keys=True)): s.output for s in script}

    def make(name: str, param: str) -> Tool:
        def fn(**kw: Any) -> str:
            return table.get((name, json.dumps(kw, sort_keys=True)), f"no results for {kw}")

        schema = {"type": "object", "properties": {param: {"type": "string"}}, "required": [param]}
        return Tool(name, f"{name.replace('_', ' ')} on the incident hosts", schema, fn)

    return [make("run_command", "cmd"), make("open_file", "path"), make("search_logs", "query")]


@dataclass
class AgenticModel(BenchModel):
    """Follows the plan (its :class:`Move` s); at a step that needs a value it looks for the
    line that names what it needs (:meth:`BenchModel.look_up`, Recall first if none does)
    and takes what that line says after its last colon. It goes on with what it found,
    right or wrong, or with ``UNKNOWN``: the workload grades the calls it makes
    (:func:`grade_plan`). In stateful mode it notes every ERROR line of the newest tool
    result in Σ, as an engineer on call would."""

    plan: list[Move] | None = None
    step: int = 0

    def turn(self, request: ModelRequest) -> ModelResponse:
        plan = self.plan or []
        if self.step >= len(plan):
            return self.act(request, text="Root cause found; the values I relied on are in the commands above.")
        s = plan[self.step]
        args = dict(s.arguments)
        if s.needs:
            line, recall = self.look_up(request, s.needs, s.query or s.needs)
            if recall is not None:
                return recall
            found = value_after_key(line) if line else "UNKNOWN"
            args = {k: v.replace(NEEDED, found) if isinstance(v, str) else v for k, v in args.items()}
        self.step += 1
        return self.act(request, tool=s.tool, arguments=args)

    def worth_noting(self, request: ModelRequest) -> dict[str, str]:
        _, last = newest(request.messages)
        if last.get("role") not in ("tool", "user"):
            return {}
        lines = [ln for ln in str(last.get("content") or "").splitlines() if " ERROR " in ln]
        return {ln.split(" ERROR ", 1)[1].rsplit(": ", 1)[0]: value_after_key(ln) for ln in lines}


@workload("agentic", "a long tool-using run: results of varied size (a few very large), needles needed late")
def agentic(config: BenchConfig, progress: Progress) -> WorkloadResult:
    """One one-shot run per mode on a frontier-like provider (so ``auto`` resolves to stateful)."""
    steps, n_needles, huge = (40, 6, 1) if config.quick else (150, 18, 3)
    return play_agentic(
        config, progress, "agentic", agentic_script(config.seed, steps=steps, needles=n_needles, huge=huge)
    )


def play_agentic(
    config: BenchConfig, progress: Progress, name: str, generated: tuple[str, str, list[Step], list[Needle]]
) -> WorkloadResult:
    """An agentic script (:func:`agentic_script`'s ``system, task, script, needles``) played
    as one one-shot run per mode of ``config.modes``; the probes search by each needle's
    question where it has one, else by its key words."""
    system, task, script, needles = generated
    steps = len(script)
    sizes = [count_text(s.output) for s in script]
    result = WorkloadResult(
        name,
        "iteration",
        params={
            "steps": steps,
            "needles": len(needles),
            "huge_results": sum(size > 3000 for size in sizes),
            "result_tokens_max": max(sizes),
            "result_tokens_mean": round(sum(sizes) / len(sizes)),
            "system_tokens": count_text(system),
        },
    )
    probes = [Probe(n.question or n.search, (n.value,), n.key) for n in needles]
    tools = agentic_tools(script)

    names = {t.name for t in tools}

    async def drive(runtime: Runtime, run: RunState, model: BenchModel | None, out: ModeRun) -> None:
        count = {"n": 0}
        calls: list[dict[str, Any]] = []  # the arguments of the workload's tool calls, in order

        def tick(event: Any) -> None:
            if event.kind == "tool_call" and event.data.get("name") in names:
                calls.append(dict(event.data.get("arguments") or {}))
            if event.kind == "tool_result" and count["n"] < steps:
                count["n"] += 1
                progress.advance()

        run.listeners.append(tick)
        res = await runtime.send(run, task)
        if res.status == "failed":
            raise_failed(res.error)
        if isinstance(model, AgenticModel):  # a real model does not follow the plan: its calls are not graded
            out.answered.extend(grade_plan(script, calls))

    for mode in with_append(config.modes):
        progress.start(f"{name} · {mode}", steps)
        result.runs[mode] = play_mode(
            config,
            mode,
            spec=bench_spec(config, mode, system=system, tools=[t.name for t in tools], max_iterations=3 * steps + 10),
            drive=drive,
            probes=probes,
            unit="iteration",
            interactive=False,
            local=False,
            tools=tools,
            make_model=lambda: AgenticModel(seed=config.seed, plan=[s.move for s in script]),
            name=name,
        )
    return result
