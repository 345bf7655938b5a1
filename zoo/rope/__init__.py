"""``q * cos + rotate_half(q) * sin`` for q and k: the rotary embedding (finding TQ108)."""
