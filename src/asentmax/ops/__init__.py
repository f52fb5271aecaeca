"""Pure tensor functions: alpha-entmax and entmax attention (layout (batch, heads, seq, head_dim))."""
