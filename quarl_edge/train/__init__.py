"""Training: the SB3 trainer with keep-best (trainer.py), default hyperparameters (hyperparams.py), QAT fake quantization (qat.py)."""
