"""The one SQL expression engine: parsing, typing rules and evaluators (partition rows, Arrow, min/max stats)."""
