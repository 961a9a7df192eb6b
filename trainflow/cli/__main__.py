"""`python -m trainflow.cli`: the `trainflow` command."""

from trainflow.cli import main

main()
