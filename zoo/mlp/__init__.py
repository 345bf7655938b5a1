"""A whole MLP block: Linear->act->Linear, or the bias-free GLU MLP down(act(gate) * up)."""
