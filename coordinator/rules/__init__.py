"""Pure decision rules: admission, validation, conflict checks and the per-table state they read (no I/O)."""
