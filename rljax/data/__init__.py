"""What tasks are built from: TFDS builders and splits, prompt batches, tokenizers, verifiers."""
