"""``python -m gym_envs.cli``: the ``patchgym`` command."""

from gym_envs.cli.commands import main

main()
