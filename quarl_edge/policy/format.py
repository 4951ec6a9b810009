"""A checkpoint folder's format tag and the names in it, apart from net.py so that recognising a
checkpoint (the safe-output check of every writer) does not import torch."""

from __future__ import annotations

CHECKPOINT_FORMAT = "quarl-edge/checkpoint"
CHECKPOINT_VERSION = 1
META_FILE = "policy.json"
WEIGHTS_FILE = "weights.npz"
# the trainer's own entries, kept across its saves and --resume
RESUME_DIR = "resume"
RESUME_FILE = "sb3_model.zip"
BEST_DIR = "best"
SELECTION_FILE = "selection.json"
ENTRIES = frozenset({META_FILE, WEIGHTS_FILE, RESUME_DIR, BEST_DIR, SELECTION_FILE})
"""every name a writer of ours puts in a checkpoint folder"""
