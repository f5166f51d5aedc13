"""``patchgym images``: the Docker backend's images, built from a debootstrap root (no registry),
listed and pruned; and ``images python-archive``, which packs a host's CPython for hosts that cannot
download the Pythons Debian does not ship (sandboxes/python_archives.py)."""

from __future__ import annotations

import re
import time
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from patchgym.cli.common import (
    DEBIAN_RELEASES,
    InstanceIdsOpt,
    TasksOpt,
    console,
    fail,
    load_selection,
    out,
    progress_bar,
    say_on_interrupt,
    status,
)

ReleaseOpt = Annotated[str | None, typer.Option(
    "--release", help=f"Debian release ({', '.join(DEBIAN_RELEASES)}, or any other debootstrap knows, with --mirror).")]


def _images():
    """The images module, once a Docker engine is known to be reachable."""
    from patchgym.sandboxes import SandboxError
    from patchgym.sandboxes.docker import images
    from patchgym.sandboxes.docker.client import docker_client

    try:
        docker_client()
    except SandboxError as exc:
        fail(str(exc))
    return images


def _release(release: str | None) -> str | None:
    """A release name as given (None: each task's own, chosen by its Python)."""
    if release is not None and not re.fullmatch(r"[a-z][a-z0-9.-]*", release):
        fail(f"invalid release name {release!r}; known ones are {', '.join(DEBIAN_RELEASES)}")
    return release


def _size(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)  # pragma: no cover


def _created(value: str) -> str:
    try:
        return datetime.fromisoformat(value[:19]).strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return value


def bootstrap(
    release: ReleaseOpt = None,
    mirror: Annotated[str | None, typer.Option("--mirror", help="Debian mirror (default: the host's apt mirror).")]
    = None,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if the image exists.")] = False,
) -> None:
    """Build the base image patchgym/base:<release> with debootstrap from a Debian mirror (no registry)."""
    from patchgym.sandboxes import SandboxError
    from patchgym.sandboxes.docker.client import DEFAULT_RELEASE

    release = _release(release) or DEFAULT_RELEASE  # $PATCHGYM_DEBIAN_RELEASE or bookworm
    images = _images()
    tag = images.base_tag(release)
    started = time.monotonic()
    say_on_interrupt("nothing half-built is kept: rerun the same command to start again")
    try:
        with status(f"bootstrapping {tag}"):
            def step(message: str) -> None:
                console.print(message, style="dim", markup=False, highlight=False)

            images.bootstrap_base(release, mirror=mirror, force=force, progress=step)
    except SandboxError as exc:
        fail(str(exc))
    out.print(f"{tag} ready ({time.monotonic() - started:.0f}s)")


def build(
    tasks: TasksOpt = None,
    instance_ids: InstanceIdsOpt = None,
    release: ReleaseOpt = None,
) -> None:
    """Build the environment and instance images of every selected task (cached ones are reused)."""
    from patchgym.sandboxes import SandboxError
    from patchgym.tasks.backends import sandbox_spec
    from patchgym.tasks.model import TaskFileError

    release = _release(release)
    _, task_set = load_selection(tasks, instance_ids)
    images = _images()
    counts = {"built": 0, "cached": 0, "failed": 0}
    say_on_interrupt("images built so far are kept: rerun the same command to go on")
    rows: list[tuple[str, str, str]] = []
    with progress_bar() as progress:
        bar = progress.add_task("building images", total=len(task_set), status="")
        for task in task_set:
            worked = False

            def step(message: str, _id: str = task.instance_id) -> None:
                nonlocal worked
                worked = True
                progress.update(bar, status=f"{_id}: {message}"[:100])

            progress.update(bar, status=task.instance_id)
            try:
                spec = sandbox_spec(task)
                tag = images.instance_image(spec.repo, spec.base_commit, spec.environment, release=release,
                                            progress=step)
                outcome = "built" if worked else "cached"
                rows.append((task.instance_id, outcome, tag))
            except (SandboxError, TaskFileError) as exc:
                outcome = "failed"
                rows.append((task.instance_id, outcome, str(exc)))
            counts[outcome] += 1
            progress.update(bar, advance=1, status=" ".join(f"{k} {v}" for k, v in counts.items()))
    table = Table(title=f"instance images ({release or 'each on a release whose Python fits it'})")
    for col in ("instance_id", "result", "image / error"):
        table.add_column(col, overflow="fold")
    colours = {"built": "green", "cached": "cyan", "failed": "red"}
    for instance_id, outcome, detail in rows:
        detail = detail if outcome != "failed" else detail.strip().splitlines()[0]
        table.add_row(instance_id, f"[{colours[outcome]}]{outcome}[/]", detail.replace("[", "\\["))
    out.print(table)
    out.print(", ".join(f"{v} {k}" for k, v in counts.items()))
    for instance_id, outcome, detail in rows:
        if outcome == "failed":
            console.print(f"[red]failed[/] {instance_id}:\n{detail}", highlight=False, markup=False)
    if counts["failed"]:
        raise typer.Exit(1)


def python_archive(
    prefix: Annotated[Path, typer.Argument(help="A CPython installation prefix (its bin/python3.X), e.g. "
                                                "~/.pyenv/versions/3.7.16.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="The archive directory to write into "
                                                                "($PATCHGYM_PYTHON_ARCHIVES).")],
) -> None:
    """Pack an installed CPython as a python-build-standalone install_only archive, for
    $PATCHGYM_PYTHON_ARCHIVES on hosts that cannot download Python (no Docker needed)."""
    from patchgym.sandboxes.python_archives import PackError, pack_installation

    started = time.monotonic()
    try:
        with status(f"packing {prefix}"):
            archive = pack_installation(prefix.expanduser(), output.expanduser())
    except PackError as exc:
        fail(str(exc))
    out.print(f"{archive} ({_size(archive.stat().st_size)}, {time.monotonic() - started:.0f}s)", highlight=False)


def list_images() -> None:
    """List the images patchgym made (base, environments, instances)."""
    from patchgym.sandboxes import SandboxError

    images = _images()
    try:
        rows = images.list_images()
    except SandboxError as exc:
        fail(str(exc))
    table = Table(title=f"{len(rows)} patchgym images")
    for col in ("tag", "kind", "id", "size", "created"):
        table.add_column(col, overflow="fold", justify="right" if col == "size" else "left")
    for r in rows:
        table.add_row(r["tag"], r["kind"], r["id"].removeprefix("sha256:")[:12], _size(r["size"]),
                      _created(r["created"]))
    out.print(table)


def prune(
    all_kinds: Annotated[bool, typer.Option("--all", help="Base images too (they take a minute to rebuild).")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only show what would be removed.")] = False,
) -> None:
    """Remove patchgym's environment and instance images that no container uses."""
    from patchgym.sandboxes import SandboxError

    images = _images()
    kinds = ("instance", "env", "base") if all_kinds else ("instance", "env")
    try:
        removed = images.prune_images(kinds, dry_run=dry_run)
    except SandboxError as exc:
        fail(str(exc))
    verb = "would remove" if dry_run else "removed"
    for ref in removed:
        out.print(f"{verb} {ref}", highlight=False)
    out.print(f"{verb} {len(removed)} image(s)")

