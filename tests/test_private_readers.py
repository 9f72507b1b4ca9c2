"""Private stays private in every reader (issue 39): over generated runs with a private tool
and an operator's mark, in every retention mode, forks included, no reader other than an
explicit ``include_private`` returns the private text or the model's repetition of it. The
model quotes what it read and copies it into Σ, and the summariser copies its whole input,
so a reader that leaks shows it."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loomrt.bench.leak_measure import MODES, leaks, play, reader_leaks
from loomrt.mcp.service import RunService
from loomrt.spec import AgentsFile
from loomrt.visibility import reader_events


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    mode=st.sampled_from(MODES),
    before=st.integers(0, 3),
    after=st.integers(1, 8),
    fork=st.booleans(),
    forked_turns=st.integers(0, 3),
    n=st.integers(1000, 9999),
)
def test_no_reader_returns_private_text_without_asking(
    mode: str, before: int, after: int, fork: bool, forked_turns: int, n: int
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        store, rt, runs, secrets = play(
            mode, folder, before=before, after=after, fork=fork, forked_turns=forked_turns, n=n
        )
        raw = json.dumps([e.to_json_dict() for e in reader_events(store, runs[0], include_private=True)])
        assert all(s in raw for s in secrets), "the record keeps it whole, and an explicit ask reads it"
        service = RunService(AgentsFile(agents={}), runtime=rt)
        assert [where for run_id in runs for where in leaks(store, run_id, service, secrets)] == []
        store.close()


def test_a_stateful_fork_with_no_turns_of_its_own_reads_without_the_parents_private_keys(tmp_path: Path) -> None:
    """The draw the property once found: the fork's working context starts from the parent's
    Σ, which must come to it (and to ``as_of``) without the keys the parent made private."""
    store, rt, runs, secrets = play("stateful", str(tmp_path), before=0, after=1, fork=True, forked_turns=0, n=4321)
    service = RunService(AgentsFile(agents={}), runtime=rt)
    raw = json.dumps([e.to_json_dict() for e in reader_events(store, runs[0], include_private=True)])
    assert all(s in raw for s in secrets), "the parent's Σ holds both secrets"
    assert [where for run_id in runs for where in leaks(store, run_id, service, secrets)] == []
    store.close()


def test_sabotage_with_redaction_made_the_identity_every_reader_leaks(tmp_path: Path, monkeypatch: Any) -> None:
    """The property can fail: with the one redaction function the identity, the readers of a
    stateful run and of its fork return the secrets."""
    import loomrt.visibility as visibility

    monkeypatch.setattr(visibility, "_redacted", lambda e, private: e)  # the fork starts from it too
    store, rt, runs, secrets = play("stateful", str(tmp_path), before=1, after=4, fork=True, forked_turns=1, n=1234)
    service = RunService(AgentsFile(agents={}), runtime=rt)
    found = [where for run_id in runs for where in leaks(store, run_id, service, secrets)]
    # get_run also withholds Σ's private keys itself (a fork's Σ comes from the shared history)
    assert {w.split(" of ")[0] for w in found} == {"events", "get_events", "export", "as_of"}
    assert any(runs[1] in w for w in found), "the fork's readers leak the parent's Σ keys"


def test_the_audit_measures_reader_rows_show_no_leak_and_a_control_that_leaks(tmp_path: Path) -> None:
    row = reader_leaks(tmp_path / "p", "recap", private=True)
    control = reader_leaks(tmp_path / "c", "recap", private=False)
    assert row["leaking"] == 0 and row["kept"] and row["readers"] == 10
    assert control["readers"] == 10 and control["leaking"] >= 5  # where a reader carries the text at all, it shows


def test_sabotage_the_audit_measures_reader_rows_say_no(tmp_path: Path, monkeypatch: Any) -> None:
    """The published figure (readers leaking: 0) comes out bad when the redaction is the identity."""
    import loomrt.visibility as visibility

    monkeypatch.setattr(visibility, "_redacted", lambda e, private: e)
    row = reader_leaks(tmp_path, "stateful", private=True)
    assert row["leaking"] >= 5 and "events" in row["where"]
