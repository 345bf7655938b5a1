"""``act(x @ Wg.T) * (x @ Wu.T)``: gate and up GEMMs plus the GLU (findings TQ103, TQ105)."""
