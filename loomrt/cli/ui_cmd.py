"""``loomrt ui``: serve the local, read-only web page over the record (:mod:`loomrt.ui`)."""

from __future__ import annotations

from pathlib import Path

import typer

from loomrt.cli._common import err, friendly

__all__ = ["ui_cmd"]


@friendly
def ui_cmd(
    port: int = typer.Option(8766, "--port", help="The port to listen on."),
    host: str = typer.Option("127.0.0.1", "--host", help="The address to listen on (off the loopback: --token-file)."),
    open_browser: bool = typer.Option(False, "--open", help="Open the page in the default browser."),
    include_private: bool = typer.Option(
        False, "--include-private", help="Show private material whole, not its placeholders (loomrt.visibility)."
    ),
    token_file: Path | None = typer.Option(
        None, "--token-file", help="A file whose first line is the token (required off the loopback; else random)."
    ),
) -> None:
    """Watch and audit runs in a browser: the runs list (live), each run's timeline with its
    distillations, what the model saw at each call, tokens over time, and runs verify's result.
    Read-only. The printed URL carries this start's token."""
    try:
        from loomrt.ui.serve import serve
    except ImportError as exc:
        err.print(f"loomrt ui needs the ui extra ({exc.name} is missing): pip install 'loomrt[ui]'")
        raise typer.Exit(1) from None
    from loomrt.record import default_store

    def announce(url: str) -> None:
        where = "" if include_private else " (private material redacted)"
        err.print(f"loomrt ui: serving the record read-only{where} at\n  {url}\nCtrl-C stops it.", highlight=False)

    serve(
        default_store(),
        host=host,
        port=port,
        token_file=token_file,
        include_private=include_private,
        open_browser=open_browser,
        announce=announce,
    )
