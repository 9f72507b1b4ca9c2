"""``python -m loomrt`` is the ``loomrt`` command."""

from loomrt.cli import main

main()
