"""Sampling on device: prefill and one `lax.while_loop` decode over a KV cache, static or
continuous batching."""
