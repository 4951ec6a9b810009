"""Pieces every stage shares, on the floor below all of them: Markdown tables (markdown.py), figures
(figures.py), limits the user sets (limits.py). They import only the standard library, the device side
(quarl_edge.runtimes), quarl_edge.text and quarl_edge.outputs, and heavy optional packages (matplotlib)
only inside the function that needs them; tests/test_floors.py holds that."""
