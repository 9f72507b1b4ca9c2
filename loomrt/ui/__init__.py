"""``loomrt ui``: a local, read-only web page to watch and audit runs.

- :mod:`loomrt.ui.read`: what the pages read (the CLI's and MCP's read model: glance,
  redaction, prompts, verify);
- :mod:`loomrt.ui.views`: each run's view checkpointed every 250 events, so that "what the
  model saw" at any call replays a few events, not the record;
- :mod:`loomrt.ui.timeline`: events as the timeline's items, and the tokens chart's series;
- :mod:`loomrt.ui.app`: the Starlette routes and Jinja2 templates (htmx and uPlot vendored
  under ``static/`` with their licenses);
- :mod:`loomrt.ui.access`: the token in the URL, then a cookie, in front of the MCP server's guard;
- :mod:`loomrt.ui.serve`: uvicorn, the printed URL.

Starlette, uvicorn and Jinja2 come with the ``ui`` extra (``pip install 'loomrt[ui]'``).
"""
