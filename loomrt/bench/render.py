"""How each standalone benchmark measure's figures become Markdown: one renderer a measure
(:data:`RENDERERS`), looked up by :func:`render_measure`, and the cell and table helpers
they share with :mod:`loomrt.bench.report`, which lays out the whole report around them."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from loomrt.bench.cells import fmt, md_table
from loomrt.bench.render_store import render_store

__all__ = ["render_measure", "RENDERERS", "fmt", "md_table"]


def _curves(c: dict[str, Any]) -> list[str]:
    """The ratio curves as two tables (× append / × append-with-backstop, and answers)."""

    def table(points: dict[str, Any], axis: str) -> list[str]:
        modes = list(next(iter(points.values())))
        rows = [
            [
                mode,
                *(
                    f"{p[mode]['ratio']:.3f} / {p[mode]['ratio_backstop']:.3f} · {fmt(p[mode]['answered'])}"
                    for p in points.values()
                ),
            ]
            for mode in modes
        ]
        return md_table(["mode", *(f"{k} {axis}" for k in points)], rows)

    return [
        "### Ratio curves",
        "",
        "Each cell: input tokens × append / × append-with-backstop (budget = the "
        f"{c['window_tokens']:,}-token window) · share of questions answered right. "
        f"Chat script, one fact per five turns, Recall embedder {c['embedder']}.",
        "",
        f"Over run length (budget {c['budget_tokens']:,}):",
        "",
        *table(c["by_length"], "turns"),
        "",
        f"Over budget ({c['turns_for_budgets']} turns):",
        "",
        *table(c["by_budget"], "budget"),
        "",
    ]


def _render_overhead(r: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    lines += ["### Runtime overhead per turn (no model, no embedding)", ""]
    lines += md_table(
        ["history (messages)", "p50 ms", "p95 ms"],
        [[f"{p['messages']:,}", f"{p['p50_ms']:.2f}", f"{p['p95_ms']:.2f}"] for p in r["points"]],
    )
    lines.append("")
    return lines


def _render_recall_latency(r: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    r = r
    lines += [
        "### Recall latency",
        "",
        f"{r['entries']:,}-entry index, {r['queries']} queries, query embedding "
        f"included: p50 {r['p50_ms']:.2f} ms, p95 {r['p95_ms']:.2f} ms.",
    ]
    if "after_eviction_p50_ms" in r:
        lines.append(
            f"The first query after a new eviction (the index just changed): p50 "
            f"{r['after_eviction_p50_ms']:.2f} ms, p95 {r['after_eviction_p95_ms']:.2f} ms." + _inline(r)
        )
    lines.append("")
    return lines


def _inline(r: dict[str, Any]) -> str:
    """How the first query after an eviction met the index, as a run meets it (in the event
    loop, a model call after the boundary): the entries of the span it indexed itself."""
    if "after_eviction_inline_entries" not in r:
        return ""
    waited = (
        f", waited for the background thread's vectors of {r['after_eviction_waited_entries']:g}"
        if "after_eviction_waited_entries" in r
        else ""
    )
    return (
        f" Measured in the running event loop, {r['after_eviction_gap_ms']:g} ms (a model call) after the "
        f"boundary: the query embedded {r['after_eviction_inline_entries']:g} of the span's 8 entries itself "
        f"(mean; {r['after_eviction_inline_share']:.0%} of queries embedded any){waited}; the background index "
        "the rest."
    )


def _render_recall_scale(r: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    r = r
    lines += [
        "### Recall at scale",
        "",
        f"{r['entries']:,}-entry index (built in {r['build_s']} s), {r['queries']} queries, each embedded by the "
        f"real embedder: p50 {r['p50_ms']:.2f} ms, p95 {r['p95_ms']:.2f} ms; first query after an eviction p95 "
        f"{r['after_eviction_p95_ms']:.2f} ms.{_inline(r)}",
        "",
    ]
    return lines


def _render_recall_clusters(r: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    r = r
    lines += [
        "### Recall with clustered codes",
        "",
        f"{r['entries']:,} entries embedded by the real embedder, the inverted file trained from "
        f"{r['ivf_min']:,} on ({r['clusters']} clusters), {r['queries']} queries searched as the index does it and "
        f"with every entry scored: the same top 5 for {r['same_top5']:.3f} of them, the same first hit for "
        f"{r['same_top1']:.3f}, {r['top5_overlap']:.3f} of the exact top 5 found; the scan's candidates held "
        f"{r['dense_top5_in_candidates']:.3f} of the exact dense top 5.",
        "",
    ]
    return lines


def _render_recall_needles(r: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    r = r
    lines += [
        "### Recall needles",
        "",
        f"{r.get('found_top5')} of {r.get('needles')} exact values stated early "
        f"and evicted were returned verbatim by Recall in its top 5.",
        "",
    ]
    return lines


def _render_recall_inject(r: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    r = r
    lines += [
        "### Recall injection's cost",
        "",
        f"The injection step before a model call (query embedding, search, choice, the `recall_injected` "
        f"event), inside the running event loop, at {r['entries']:,} entries (dense: {r['dense']}): "
        f"p50 {r['step_p50_ms']:.2f} ms, p95 {r['step_p95_ms']:.2f} ms over {r['queries']} calls "
        f"({r['injected_share']:.0%} of them injected a block), after the process's first step "
        f"({r.get('first_step_ms', float('nan')):.0f} ms: loading the token counter's tables and the BLAS "
        f"thread pool, once per process). The runtime's own time per turn at that "
        f"history, injection included: p50 {r['turn_overhead_p50_ms']:.2f} ms; the step is "
        f"{r['step_share_of_turn']:.0%} of it.",
        "",
    ]
    return lines


def _render_concurrency(r: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    c = r
    lines += [
        "### Concurrency",
        "",
        f"{c['runs']} recap chats of {c['turns_per_run']} turns at once in one process (model latency "
        f"{c['model_latency_ms']:.0f} ms): {c['finished']} finished in {c['wall_s']} s (the model waits alone, "
        f"one after another, would take {c['serial_model_wait_s']} s). Runtime time per turn: p50 "
        f"{c['p50_ms']:.2f} ms, p99 {c['p99_ms']:.2f} ms (×{c['p99_over_p50']}); turns without a boundary "
        f"({c['turns_without_boundary']}): p50 {c['plain_p50_ms']:.2f} ms, p99 {c['plain_p99_ms']:.2f} ms.",
        "",
    ]
    return lines


def _render_mcp(r: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    c = r
    lines += [
        "### MCP",
        "",
        f"`loomrt mcp` over stdio with the SDK's client: `spawn_run` of a run whose model answers at once, "
        f"{c['round_trips']} times: p50 {c['spawn_run_p50_ms']:.1f} ms, p95 {c['spawn_run_p95_ms']:.1f} ms. "
        f"`spawn_runs` of {c['fan_out']} runs whose model takes {c['model_s_each']} s each: {c['fan_out_ok']} ok "
        f"in {c['fan_out_wall_s']} s, overlap ×{c['overlap']} (×{c['fan_out']} at best, ×1 if they ran one "
        f"after another). An MCP server as a tool source: started on first use in {c['server_start_s']} s; "
        f"then p50 {c['mcp_call_p50_ms']:.2f} ms a call against {c['builtin_call_p50_ms']:.3f} ms for the "
        f"built-in calculate ({c['extra_ms_per_call']:.2f} ms more), over {c['tool_calls']} calls.",
        "",
    ]
    return lines


def _render_fork_cost(r: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    f = r
    lines += [
        "### Fork cost",
        "",
        f"`Runtime.fork` at the run's last seq, median of {f['forks']} forks, after a "
        f"scripted chat of each length ({f['goal']}):",
        "",
    ]
    last = f["sizes"][-1]
    lines += md_table(
        [
            "mode",
            *(f"ms at {n:,} messages" for n in f["sizes"]),
            f"× ({last:,} ÷ {f['sizes'][0]:,})",
            f"first Recall, ms at {last:,}",
            f"entries the fork indexed at {last:,}",
        ],
        [
            [
                r["mode"],
                *(f"{r[f'ms_at_{n}']:.1f}" for n in f["sizes"]),
                f"{r['ratio']:.2f}",
                f"{r[f'first_recall_ms_at_{last}']:.1f}" if f"first_recall_ms_at_{last}" in r else "–",
                f"{r['fork_indexed_at_largest']:,}" if "fork_indexed_at_largest" in r else "–",
            ]
            for r in f["rows"]
        ],
    )
    lines.append("")
    return lines


def _fanout(f: dict[str, Any]) -> list[str]:
    lines = [
        "### Fan-out",
        "",
        "A parent spawns N stateful children of H steps each (`parallel_spawn`, one Σ row per child) against the "
        "same children returning their transcripts. Tokens of the parent's working context after the fan-out, "
        "and input tokens of parent and children together:",
        "",
        "| N | H | parent context, Σ rows | parent context, transcripts | × | total input, Σ rows | total input, transcripts | × |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in f.get("rows", []):
        lines.append(
            f"| {r['children']} | {r['horizon']} | {r['state_parent_tokens']:,} | {r['transcript_parent_tokens']:,} "
            f"| {r['parent_ratio']} | {r['state_total_input_tokens']:,} | {r['transcript_total_input_tokens']:,} "
            f"| {r['total_ratio']} |"
        )
    ledger = f.get("ledger")
    if ledger:
        lines += [
            "",
            "The overwriting child's Σ (`{step, finding}`) cannot grow; the ledger child's Σ appends a finding "
            f"each step, and only its Σ budget ({ledger['sigma_budget_tokens']} tokens) keeps its row bounded:",
            "",
            "| N | H | largest Σ row, overwriting | largest Σ row, ledger | findings kept | parent context, ledger rows |",
            "|---|---|---|---|---|---|",
        ]
        for r in f.get("rows", []):
            lines.append(
                f"| {r['children']} | {r['horizon']} | {r['state_row_tokens']} | {r['ledger_row_tokens']} "
                f"| {r['ledger_findings_kept']} | {r['ledger_parent_tokens']:,} |"
            )
        by_h = ", ".join(f"H={h}: {t}" for h, t in ledger["row_tokens_by_horizon"].items())
        lines += [
            "",
            f"Largest ledger row by H: {by_h} tokens: **{'within' if ledger['within_budget'] else 'over'} the Σ "
            f"budget**, ×{ledger['growth']} from the shortest H to the longest.",
        ]
    return [*lines, ""]


def _audit(a: dict[str, Any]) -> list[str]:
    v = a["verify"]
    lines = [
        "### Audit trail",
        "",
        f"Scripted interactive chats of {a['turns']} turns per mode. **Pins**: an operator pins the user's decision "
        "(turn 2); the share of later turns whose working context holds it verbatim, pinned and not (an extractive "
        "summariser). **Private**: a vault tool's secret, against a summariser that copies its whole input; summaries "
        "and summariser prompts that contain the secret, the tool private and not:",
        "",
        "| mode | distillations | decision kept, pinned | kept, not pinned | secret leaks, private | leaks, ordinary tool |",
        "|---|---|---|---|---|---|",
    ]
    for r in a["rows"]:
        lines.append(
            f"| {r['mode']} | {r['distillations']} | {r['pinned_kept']:.0%} | {r['unpinned_kept']:.0%} "
            f"| {r['private_leaks']} | {r['control_leaks']} |"
        )
    lines += [
        "",
        f"`runs verify` re-derives the working context at each of the {v['prompts_checked']} turns of a 200-turn recap "
        f"chat ({v['events']} events) and checks its hash: {v['ms_per_1000_events']} ms per 1,000 events, "
        f"{v['problems']} problems; hashing one prompt costs a turn {v['hash_us_per_turn']} µs.",
        "",
    ]
    if a.get("readers"):
        lines += [
            "**Readers**: a chat built to leak (the model quotes a private token and an operator-marked PIN and "
            "copies them into Σ, the summariser copies its whole input, a fork talks on), read by every reader of "
            "the parent and the fork (events, MCP get_run and get_events, the export, the context as of the end). "
            "Readers that returned a secret, and, as the control, with an ordinary tool and no mark:",
            "",
            "| mode | readers | leaking, private | leaking, control | the record keeps every word |",
            "|---|---|---|---|---|",
        ]
        for r in a["readers"]:
            lines.append(
                f"| {r['mode']} | {r['readers']} | {r['leaking']}{' (' + ', '.join(r['where']) + ')' if r['where'] else ''} "
                f"| {r['control']['leaking']} of {r['control']['readers']} | {'yes' if r['kept'] else '**no**'} |"
            )
        lines.append("")
    return lines


def _integrity(a: dict[str, Any]) -> list[str]:
    v, cost = a["verify"], a["append_us_per_turn"]
    lines = [
        "### Integrity",
        "",
        f"Each tampering of the threat model (docs/reliability.md), made with direct SQL on a copy of a record the "
        f"runtime wrote; `runs verify` detected **{a['detected']} of {len(a['rows'])}** (the untouched records "
        f"verify {'clean' if a['control_clean'] else 'NOT clean'}):",
        "",
        "| tampering | detected | what verify said first |",
        "|---|---|---|",
    ]
    for r in a["rows"]:
        lines.append(f"| {r['what']} | {'yes' if r['detected'] else '**no**'} | {r['first'] or '–'} |")
    lines += [
        "",
        f"`runs verify` with every check on a 200-turn recap chat ({v['events']} events): "
        f"{v['ms_per_1000_events']['all']} ms per 1,000 events, {v['ms_per_1000_events']['without_prompts']} ms "
        f"without re-deriving the prompts. A turn's append (4 events and the head anchor, one transaction): "
        f"{cost['v1']} µs plain (v1), {cost['v2']} µs keyed (v2).",
        "",
    ]
    return lines


def _ui(a: dict[str, Any]) -> list[str]:
    lr = a["long_run"]
    lines = [
        "### loomrt ui",
        "",
        f"Counted work of each page, through the app's routes over SQLite (server ms beside it, for the reader; "
        f"the goals are on counts). The runs page lists the newest {a['rows_shown']}.",
        "",
        "| page | store queries | runs summed | events read | events replayed | ms |",
        "|---|---|---|---|---|---|",
    ]

    def row(what: str, f: dict[str, Any]) -> str:
        counts = (f["queries"], f.get("runs_summed", 0), f["events_read"], f.get("replayed", 0))
        return f"| {what} | " + " | ".join(f"{c:,}" for c in counts) + f" | {f['ms']} |"

    for n, f in a["runs_page"].items():
        lines.append(row(f"runs page, {int(n):,} runs held", f))
    for n, f in a.get("runs_poll", {}).items():
        lines.append(row(f"the same polled again, nothing moved ({int(n):,} runs)", f))
    run = f"a run of {lr['events']:,} events"
    for key, what in (
        ("prompt_cold", "what the model saw at its last call, cold server (the one replay)"),
        ("open", "open (a fresh server)"),
        ("warm", "warmed (the page asks once shown: the one replay, checkpointed)"),
        ("next_page", "its timeline's next page"),
        ("prompt_last", "what the model saw at its last call"),
        ("prompt_middle", "what the model saw at its middle call"),
        ("prompt_first", "what the model saw at its first call"),
    ):
        if key in lr:
            lines.append(row(f"{run}: {what}", lr[key]))
    if "checkpoint_every" in lr:
        lines += ["", f"The server keeps a copy of a run's view every {lr['checkpoint_every']} events."]
    lines += ["", "Goals: " + "; ".join(f"{g}: {'yes' if ok else '**no**'}" for g, ok in a["goals"].items()) + ".", ""]
    return lines


def _local_speed(r: dict[str, Any]) -> list[str]:
    """A chat on the embedded model, turn by turn, against the machine's floor (issue 43's goals)."""
    lines = [
        f"### A local chat's speed ({r['model']})",
        "",
        "A turn's floor is prefilling its new messages and decoding what its calls wrote, at the machine's "
        "rates measured just before and after the chat (their mean); a recap due at the watermark is written "
        "between turns (`between`), not in the turn.",
        "",
    ]
    if "prefill_tps" in r:  # one measurement for both chats (before 2026-12-07)
        lines[2] = (
            f"This machine: prefill {r['prefill_tps']:.0f} tokens/s, decode {r['decode_tps']:.1f} tokens/s. " + lines[2]
        )
    for variant in ("two_calls", "one_call"):
        if variant in r:
            lines += _local_speed_variant(variant, r[variant])
    return lines


def _local_speed_variant(variant: str, r: dict[str, Any]) -> list[str]:
    lines = [
        f"**{'Decide, then answer (two calls)' if variant == 'two_calls' else 'One call a turn'}**",
        "",
        *(
            [
                f"Rates: prefill {r['rates_before']['prefill_tps']:.0f} and {r['rates_after']['prefill_tps']:.0f} "
                f"tokens/s, decode {r['rates_before']['decode_tps']:.1f} and {r['rates_after']['decode_tps']:.1f} "
                "(before and after the chat).",
                "",
            ]
            if "rates_before" in r
            else []
        ),
        "| turn | seconds | floor | × floor | first token (s) | input | cached | calls | between (s) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, t in enumerate(r["turns"], 1):
        share = f"{t['cached_tokens'] / t['input_tokens']:.0%}" if t["input_tokens"] else "-"
        lines.append(
            f"| {i} | {t['seconds']} | {t['floor_s']} | {fmt(t['over_floor'])} | {fmt(t['first_token_s'])} | "
            f"{t['input_tokens']:,} | {share} | {t['model_calls']} | {t['between_s']} |"
        )
    goals = {
        "median turn ≤ 1.25× its floor": r["median_over_floor"] <= 1.25,
        "cached share ≥ 75%": (r["cached_share"] or 0) >= 0.75,
        "first answer token ≤ 3 s": r["median_first_token_s"] is not None and r["median_first_token_s"] <= 3,
    }
    lines += [
        "",
        f"Median turn {r['median_s']} s against a median floor of {r['median_floor_s']} s "
        f"(×{r['median_over_floor']}); cached share {fmt(r['cached_share'])}; first answer token "
        f"{fmt(r['median_first_token_s'])} s (median, turns after the first); {r['model_calls_per_turn']} model "
        f"calls a turn; {r['recaps']} recaps, {r['recaps_rejected']} rejected tries; "
        f"{r['turns_failed']} turns failed.",
        "",
        "Goals: " + "; ".join(f"{g}: {'yes' if ok else '**no**'}" for g, ok in goals.items()) + ".",
        "",
    ]
    return lines


def _local_recaps(r: dict[str, Any]) -> list[str]:
    """A long chat's recaps on the embedded model: how many the prose check rejected (issue 43)."""
    lines = [
        f"### A long chat's recaps ({r['model']})",
        "",
        f"{r['turns']} turns ({r['turns_failed']} failed), {r['recaps']} recaps, {r['recaps_rejected']} rejected "
        f"tries (share {fmt(r['rejected_share'])}), {r['declined']} declined; a recap {fmt(r['recap_chars_median'])} "
        f"characters and {fmt(r['recap_seconds_median'])} s (median), a turn {fmt(r['turn_seconds_median'])} s; "
        f"facts still in the context at the end: {len(r['facts_kept'])} of {r['facts_stated']}"
        + (f" (lost: {', '.join(r['facts_lost'])})" if r["facts_lost"] else "")
        + ".",
        "",
    ]
    lines += [f"- try {x['attempt']} rejected: {x['reason']} ({x['text'][:80]!r})" for x in r["rejections"]]
    ok = "yes" if r["goal_met"] else "**no**"
    return [*lines, "", f"Goal: at most 1 rejected try in 10, over at least 20 recaps: {ok}.", ""]


def _harvest_speed(r: dict[str, Any]) -> list[str]:
    """Consolidation on the embedded model: spans a minute against issue 48's goal."""
    ok = "yes" if r["goal_met"] else "**no**"
    return [
        f"### Consolidation speed ({r['model']}, {r['conversation']}, {r['sessions']} sessions)",
        "",
        f"{r['spans']} spans ({r['turns']} turns) in {r['seconds']} s: {fmt(r['spans_per_min'])} spans a minute, "
        f"{fmt(r['seconds_per_fact'])} s a fact ({r['facts']} facts, {r['batches']} batches, {r['retries']} retries, "
        f"{r['dead_letters']} dead letters). The model: {r['model_calls']} calls, {r['tokens_read']:,} tokens read, "
        f"{r['tokens_written']:,} written, {r['model_seconds']} s in its calls; "
        f"{r.get('stopped_repeating', 0)} replies stopped where they began to repeat. Statements dropped: "
        + (", ".join(f"{k} {v}" for k, v in sorted(r.get("dropped", {}).items())) or "none")
        + ".",
        "",
        f"Goal (issue 48): at least {r['goal_spans_per_min']} spans a minute: {ok}.",
        "",
    ]


RENDERERS: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "overhead": _render_overhead,
    "recall_latency": _render_recall_latency,
    "recall_scale": _render_recall_scale,
    "recall_clusters": _render_recall_clusters,
    "recall_needles": _render_recall_needles,
    "recall_inject": _render_recall_inject,
    "curves": _curves,
    "concurrency": _render_concurrency,
    "mcp": _render_mcp,
    "fanout": _fanout,
    "audit": _audit,
    "integrity": _integrity,
    "fork_cost": _render_fork_cost,
    "store": render_store,
    "ui": _ui,
    "local_speed": _local_speed,
    "local_recaps": _local_recaps,
    "harvest_speed": _harvest_speed,
}
"""How each standalone measure renders its figures (one function a measure; a new measure adds one here)."""


def render_measure(name: str, figures: dict[str, Any]) -> list[str]:
    """The Markdown lines of one measure's figures: its renderer's, or its figures as JSON."""
    render = RENDERERS.get(name)
    if render is None:
        return [f"### {name}", "", "```json", json.dumps(figures, indent=2), "```", ""]
    return render(figures)
