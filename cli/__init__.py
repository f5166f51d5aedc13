"""The ``patchgym`` command line: the top layer, above the server, driving every layer below it
(docs/architecture.md). :mod:`patchgym.cli.app` mounts the command groups, one module each; :mod:`patchgym.cli.common`
holds what they share."""

from patchgym.cli.app import app, main

__all__ = ["app", "main"]
