"""Who may read the UI: the MCP server's guard (:class:`loomrt.mcp.http.Guard`: Host, Origin,
bearer token, compared in constant time), with the browser's way of carrying the token.

A browser cannot send ``Authorization`` on a link, so, as Jupyter does, the printed URL
carries the token (``?token=...``). The first request with it is answered with a redirect to
the same page without it, setting an HttpOnly, SameSite=Strict cookie; later requests carry
the cookie, which this layer turns into the ``Authorization`` header the guard checks. A
request with neither is refused (401) by the guard itself. A client that is not a browser
can send ``Authorization: Bearer TOKEN`` as it would to ``loomrt mcp --http``.

On the loopback the token is random for each start (:func:`new_token`); off it the server
refuses to start without ``--token-file`` (:func:`loomrt.mcp.http.check_listen`, with a token
required here even on the loopback: a read-only page still shows every run).
"""

from __future__ import annotations

import hmac
import secrets
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode

from loomrt.errors import SpecError
from loomrt.mcp.http import TOKEN_MIN_CHARS, Guard, allowed_origins, check_listen, is_loopback

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Send

__all__ = ["COOKIE", "TokenCarrier", "guarded", "new_token", "check_ui_listen"]

COOKIE = "loomrt_ui_token"

Scope = dict[str, Any]


def new_token() -> str:
    """A random token for one start of the server (43 URL-safe characters)."""
    return secrets.token_urlsafe(32)


def check_ui_listen(host: str, token_file_given: bool, token: str) -> None:
    """Refuse off the loopback without ``--token-file`` (a random token printed to a terminal is
    no way to share access to another machine), and a short token anywhere."""
    if not is_loopback(host) and not token_file_given:
        raise SpecError(
            f"refusing to serve the UI on {host} without --token-file: anyone who can reach it could read "
            "every run. Pass --token-file FILE (its first line, 32 characters or more), or serve on 127.0.0.1."
        )
    if len(token) < TOKEN_MIN_CHARS:
        raise SpecError(
            f"the UI token is {len(token)} characters; it must have at least {TOKEN_MIN_CHARS}. "
            "Make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))' > FILE"
        )
    check_listen(host, token)


class TokenCarrier:
    """ASGI middleware in front of the guard: ``?token=`` becomes a cookie (and a redirect to the
    URL without it), and the cookie becomes ``Authorization: Bearer``."""

    def __init__(self, app: Guard, token: str, *, port: int = 0):
        self.app = app
        self.token = token
        self.cookie = f"{COOKIE}_{port}" if port else COOKIE
        """Browsers do not keep cookies apart by port: each server's has its port in its name,
        so two ``loomrt ui`` on one host never overwrite each other's."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        given = next((v for k, v in query if k == "token"), None)
        if given is not None and hmac.compare_digest(given.encode(), self.token.encode()):
            rest = urlencode([(k, v) for k, v in query if k != "token"])
            location = scope.get("path", "/") + (f"?{rest}" if rest else "")
            cookie = f"{self.cookie}={self.token}; Path=/; HttpOnly; SameSite=Strict"
            await send(
                {
                    "type": "http.response.start",
                    "status": 303,
                    "headers": [(b"location", location.encode()), (b"set-cookie", cookie.encode())],
                }
            )
            await send({"type": "http.response.body", "body": b""})
            return
        headers = list(scope.get("headers", []))
        has_auth = any(k.lower() == b"authorization" for k, _ in headers)
        carried = _cookie(headers, self.cookie)
        if not has_auth and carried is not None:
            headers.append((b"authorization", f"Bearer {carried}".encode("latin-1")))
            scope = {**scope, "headers": headers}
        await self.app(scope, receive, send)


def _cookie(headers: list[tuple[bytes, bytes]], cookie: str) -> str | None:
    for k, v in headers:
        if k.lower() != b"cookie":
            continue
        for part in v.decode("latin-1").split(";"):
            name, _, value = part.strip().partition("=")
            if name == cookie:
                return value
    return None


def guarded(app: ASGIApp, *, host: str, port: int, token: str) -> TokenCarrier:
    """``app`` behind the token carrier and the MCP server's guard (Host, Origin, token)."""
    return TokenCarrier(
        Guard(app, host=host, port=port, token=token, origins=allowed_origins(host, port)), token, port=port
    )
