"""Hugging Face interop: Qwen3 / Qwen3-MoE checkpoints in and out, and their tokenizers."""
