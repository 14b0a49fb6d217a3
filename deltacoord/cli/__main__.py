"""`python -m deltacoord.cli ...` runs the `deltacoord` command."""

from deltacoord.cli.main import run

run()
