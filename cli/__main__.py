"""``python -m patchgym.cli``: the ``patchgym`` command."""

from patchgym.cli.app import main

main()
