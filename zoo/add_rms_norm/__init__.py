"""``h = x + residual; rms_norm(h)``: the residual add fused into RMSNorm (finding TQ107)."""
