"""``act(gate) * up``: the GeGLU / SwiGLU pointwise pattern (finding TQ103)."""
