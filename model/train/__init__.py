"""Training: token-budget batches, the trainer, evaluation and release of checkpoints."""
