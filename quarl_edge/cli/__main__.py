"""`python -m quarl_edge.cli ...` is the `quarl-edge` command."""

from quarl_edge.cli import main

main()
