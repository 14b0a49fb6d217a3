"""The _delta_log edge: publication of ratified commits, checkpoints (and their worker process), verification."""
