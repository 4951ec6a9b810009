"""Recorded rollouts of the zoo policies (package data, read with importlib.resources)."""
