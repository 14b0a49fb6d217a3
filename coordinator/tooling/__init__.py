"""Tooling: the deltacoord CLI, demo, bench and the local servers it starts."""
