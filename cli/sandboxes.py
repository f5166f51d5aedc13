"""``patchgym sandboxes``: what crashed processes left behind (local sandboxes, cgroups,
containers), found by patchgym's labels and owners and removed."""

from __future__ import annotations

from typing import Annotated

import typer

from patchgym.cli.common import out, reap


def gc(
    docker: Annotated[bool, typer.Option("--docker/--no-docker", help="Also remove patchgym's containers.")] = True,
    every_owner: Annotated[bool, typer.Option(
        "--all", help="Every patchgym container: also those of live processes and of other hosts.")] = False,
) -> None:
    """Remove sandboxes, cgroups and containers whose owning process is gone (never anything
    without patchgym's label). Containers owned by other hosts sharing the Docker engine are left
    alone unless --all: this host cannot tell whether their owners still run."""
    from patchgym.sandboxes.docker import docker_available

    kept: list[str] = []
    removed = reap(docker=docker and docker_available(), every_owner=every_owner, kept=kept)
    out.print(f"removed {removed['local']} local leftovers and {removed['docker']} containers")
    for line in kept:
        out.print(f"left {line}", highlight=False)
