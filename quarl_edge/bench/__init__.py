"""Bench: run every model of a bundle on paired seeds (run.py), partial results and resume (partial.py), reports (report.py)."""
