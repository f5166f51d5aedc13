"""The ``patchgym`` command: the top layer, which drives every other (:mod:`.commands` holds the
commands, :mod:`.images` the ``images`` group, :mod:`.common` what they share)."""

from gym_envs.cli.commands import app, main

__all__ = ["app", "main"]
