"""`python -m infbench ...`: the same CLI as the `infbench` command (useful with PYTHONPATH
pointing at another checkout, as `.ci/gate` runs the base commit)."""

from infbench.cli import main

main()
