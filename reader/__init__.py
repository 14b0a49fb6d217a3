"""Readers: snapshots from _delta_log and the live change feed on the commits topic."""
