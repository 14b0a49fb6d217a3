"""`python -m deltacoord.cli ...` runs the `deltacoord` command."""

from deltacoord.cli.main import main

main()
