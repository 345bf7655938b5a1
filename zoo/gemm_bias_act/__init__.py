"""``act(x @ W.T + b)``: the Linear+activation pattern (findings TQ101, TQ102)."""
