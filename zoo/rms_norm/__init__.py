"""``x * rsqrt(mean(x²) + eps) * w``: RMSNorm (finding TQ107)."""
