"""Stage 1, load: bytes → typed Polars frames (`source` reads, `decode` parses, `frames` types)."""
