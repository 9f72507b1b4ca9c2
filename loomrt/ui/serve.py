"""Serving the UI: check the address and token, print the URL that carries the token, run uvicorn."""

from __future__ import annotations

import socket
import threading
import webbrowser
from collections.abc import Callable
from pathlib import Path

from loomrt.errors import SpecError
from loomrt.mcp.http import read_token
from loomrt.record.store import Store
from loomrt.ui.access import check_ui_listen, guarded, new_token

__all__ = ["serve", "ui_token", "url_of"]


def ui_token(host: str, token_file: Path | None) -> str:
    """The token for this start: ``--token-file``'s, else a random one (allowed on the loopback only)."""
    token = read_token(token_file) if token_file is not None else new_token()
    assert token is not None  # read_token with a file returns its token or raises
    check_ui_listen(host, token_file is not None, token)
    return token


def url_of(host: str, port: int, token: str) -> str:
    """The URL to open: the page, with the token a browser turns into a cookie."""
    name = f"[{host}]" if ":" in host else host
    return f"http://{name}:{port}/?token={token}"


def _port_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise SpecError(f"cannot listen on {host}:{port} ({exc.strerror}): pass another --port") from None


def serve(
    store: Store,
    *,
    host: str,
    port: int,
    token_file: Path | None,
    include_private: bool,
    open_browser: bool,
    announce: Callable[[str], None],
) -> None:
    """Serve the UI over ``store`` until stopped (Ctrl-C)."""
    import uvicorn

    from loomrt.ui.app import create_app

    if not 1 <= port <= 65535:
        raise SpecError(f"--port must be between 1 and 65535, not {port}")
    token = ui_token(host, token_file)
    _port_free(host, port)
    app = guarded(create_app(store, include_private=include_private), host=host, port=port, token=token)
    url = url_of(host, port, token)
    announce(url)
    if open_browser:
        threading.Timer(0.5, webbrowser.open, [url]).start()
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
