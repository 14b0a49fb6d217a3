"""The `deltacoord` command line (`main.py` holds the command group; one module per command family)."""
