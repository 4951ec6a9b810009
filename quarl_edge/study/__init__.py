"""The paper's experiments as commands: PTQ across policies x precisions (ptq.py), plots (plots.py)."""
