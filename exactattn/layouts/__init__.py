"""Today's kernel layouts on the one algorithm: packed variable-length batches, paged KV
caches, and flash-attn's interface over them."""
