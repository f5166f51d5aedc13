"""``python -m cli``: the ``patchgym`` command."""

from cli.app import main

main()
