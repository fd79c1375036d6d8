"""The policy network: a Qwen3-MoE-shaped decoder (transformer), its MoE layer and blocks, and the
critic built on its trunk."""
