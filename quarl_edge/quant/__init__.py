"""Quantization on the host: weight-only n-bit PTQ (weights.py) and QAT -> deployable policy with learned ranges."""
