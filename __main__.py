"""``python -m patchgym``: the ``patchgym`` command."""

from patchgym.cli.app import main

main()
