"""Policies: the torch policy net and its checkpoints (net.py), SB3 / RL Zoo import (sb3.py), loading (load.py), the env registry (registry.py)."""
