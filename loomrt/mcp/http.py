"""`loomrt mcp --http`: streamable HTTP behind loomrt's own guard.

The guard runs before the SDK sees a request, so nothing a refused request says reaches a
tool. In order:

1. On the loopback, ``Host`` must name this server (127.0.0.1 or localhost, with its port);
   an ``Origin``, when sent, must be one of the allowed origins: a web page a browser
   opened on another site cannot reach a server on the loopback (DNS rebinding).
2. With tokens configured, ``Authorization: Bearer TOKEN`` must match one, compared in
   constant time (:func:`hmac.compare_digest`). Tokens are never logged. The operator token
   (``--token-file`` / ``$LOOMRT_MCP_TOKEN``) is bound to no user: its client sees every run.
   A token from ``--users FILE`` (lines ``USER TOKEN``) is bound to its user, whom the guard
   names to the server in the request's ASGI scope (:data:`USER_KEY`); that client works only
   with its user's runs and memory (:mod:`loomrt.mcp.service`).

:func:`check_listen` refuses to start on a non-loopback address without a token, and
refuses a token shorter than :data:`TOKEN_MIN_CHARS`.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from loomrt.errors import SpecError

__all__ = [
    "Guard",
    "check_listen",
    "read_token",
    "read_user_tokens",
    "allowed_origins",
    "TOKEN_MIN_CHARS",
    "TOKEN_ENV",
    "USER_KEY",
]

TOKEN_MIN_CHARS = 32
TOKEN_ENV = "LOOMRT_MCP_TOKEN"
USER_KEY = "loomrt.user"
"""The ASGI scope key where the guard puts the user a request's token is bound to."""

Scope = dict[str, Any]


def read_token(token_file: Path | None) -> str | None:
    """The bearer token: from ``--token-file`` (its first line), else $LOOMRT_MCP_TOKEN, else None."""
    if token_file is not None:
        try:
            text = token_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecError(f"cannot read the token file: {exc}", where=str(token_file)) from None
        token = text.strip().splitlines()[0].strip() if text.strip() else ""
        if not token:
            raise SpecError("the token file is empty", where=str(token_file))
        return token
    return os.environ.get(TOKEN_ENV) or None


def read_user_tokens(users_file: Path) -> dict[str, str]:
    """``--users FILE``: each line ``USER TOKEN`` (blank lines and ``#`` comments skipped);
    returns token to user. One clear error naming the line for a bad one."""
    from loomrt.harvest.scopes import ScopeError, resolve_scopes

    try:
        lines = users_file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read the users file: {exc}", where=str(users_file)) from None
    tokens: dict[str, str] = {}
    for no, line in enumerate(lines, 1):
        where = f"{users_file}:{no}"
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        if len(fields) != 2:
            raise SpecError("expected USER TOKEN (two fields, separated by spaces)", where=where)
        user, token = fields
        try:
            resolve_scopes(["user"], agent="-", user=user, project=None)
        except ScopeError as exc:
            raise SpecError(str(exc), where=where) from None
        if len(token) < TOKEN_MIN_CHARS:
            raise SpecError(
                f"{user}'s token has {len(token)} characters; it must have at least {TOKEN_MIN_CHARS}", where=where
            )
        if token in tokens:
            raise SpecError(
                f"{user}'s token is also {tokens[token]}'s: each user needs a token of its own", where=where
            )
        tokens[token] = user
    if not tokens:
        raise SpecError("the users file names no user (lines: USER TOKEN)", where=str(users_file))
    return tokens


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_listen(host: str, token: str | None, *, users: bool = False) -> None:
    """Refuse a configuration that would expose runs: no token off the loopback (the tokens
    of a users file count), or a short token."""
    if token is not None and len(token) < TOKEN_MIN_CHARS:
        raise SpecError(
            f"the MCP token is {len(token)} characters; it must have at least {TOKEN_MIN_CHARS}. "
            "Make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
    if token is None and not users and not is_loopback(host):
        raise SpecError(
            f"refusing to serve on {host} without a token: anyone who can reach it could run agents. "
            f"Set ${TOKEN_ENV} or pass --token-file, or serve on 127.0.0.1."
        )


def allowed_origins(host: str, port: int, extra: Iterable[str] = ()) -> set[str]:
    """The origins a browser may send: this server's own, and any given with --allow-origin."""
    names = {"127.0.0.1", "localhost", f"[{host}]" if ":" in host else host}
    return {f"{scheme}://{name}:{port}" for name in names for scheme in ("http", "https")} | set(extra)


class Guard:
    """ASGI middleware: Host, Origin and bearer-token checks before ``app`` sees a request."""

    def __init__(
        self,
        app: Any,
        *,
        host: str,
        port: int,
        token: str | None,
        origins: set[str],
        users: dict[str, str] | None = None,
    ):
        self.app = app
        # On the loopback, Host must name this server (DNS rebinding). Off it, clients name the
        # machine however they reach it, and the token (required there) is the guard.
        names = ("127.0.0.1", "localhost", f"[{host}]" if ":" in host else host)  # Host brackets an IPv6 address
        self.hosts = {f"{name}:{port}" for name in names} if is_loopback(host) else None
        self.origins = origins
        self.tokens: list[tuple[bytes, str | None]] = [(t.encode(), u) for t, u in (users or {}).items()]
        if token:
            self.tokens.append((token.encode(), None))

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        refusal = self.refusal(headers)
        if refusal is not None:
            status, message = refusal
            await _respond(send, status, message, bearer=status == 401)
            return
        await self.app({**scope, USER_KEY: self.user_of(headers)}, receive, send)

    def user_of(self, headers: dict[str, str]) -> str | None:
        """The user the request's token is bound to (None: the operator token, or no tokens)."""
        given = headers.get("authorization", "").partition(" ")[2].strip().encode()
        found = None
        for token, user in self.tokens:  # every token compared, in constant time each
            if hmac.compare_digest(given, token):
                found = user
        return found

    def refusal(self, headers: dict[str, str]) -> tuple[int, str] | None:
        """Why a request with ``headers`` is refused (status, message), or None."""
        if self.hosts is not None and headers.get("host") not in self.hosts:
            return 421, "this server does not answer for that Host"
        origin = headers.get("origin")
        if origin is not None and origin not in self.origins:
            return 403, "origin not allowed (pass --allow-origin to permit it)"
        if self.tokens:
            scheme, _, given = headers.get("authorization", "").partition(" ")
            matched = [hmac.compare_digest(given.strip().encode(), token) for token, _ in self.tokens]
            if scheme.lower() != "bearer" or not any(matched):
                return 401, "a valid bearer token is required (Authorization: Bearer TOKEN)"
        return None


async def _respond(send: Any, status: int, message: str, *, bearer: bool) -> None:
    body = json.dumps({"error": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if bearer:
        headers.append((b"www-authenticate", b'Bearer realm="loomrt"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def serve_http(
    server: Any, *, host: str, port: int, token: str | None, origins: set[str], users: dict[str, str] | None = None
) -> None:
    """Serve ``server`` (a :class:`~loomrt.mcp.server.LoomMCPServer`) on http://HOST:PORT/mcp until stopped."""
    import uvicorn
    from mcp.server.transport_security import TransportSecuritySettings

    inner = server.streamable_http_app(
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        host=host,
    )  # the Guard checks Host and Origin itself, before the token
    app = Guard(inner, host=host, port=port, token=token, origins=origins, users=users)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="on")
    await uvicorn.Server(config).serve()
