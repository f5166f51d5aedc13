"""The ``patchgym`` command tree: every group and command is mounted here, from the module that
holds its group (:mod:`cli.tasks`, :mod:`cli.repos`, :mod:`cli.evaluation`, :mod:`cli.serving`,
:mod:`cli.images`), so this file is the whole command line at a glance."""

from __future__ import annotations

import logging
import os
import sys

import typer

from cli import evaluation, images, repos, serving, tasks
from cli.common import console

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="SWE-bench-style verifiable-reward environments.")

tasks_app = typer.Typer(no_args_is_help=True, help="Browse, validate, import, export and make task sets.")
app.add_typer(tasks_app, name="tasks")
tasks_app.command("list")(tasks.list_tasks)
tasks_app.command("show")(tasks.show)
tasks_app.command("validate")(tasks.validate)
tasks_app.command("import-swebench")(tasks.import_swebench)
tasks_app.command("export")(tasks.export)
tasks_app.command("mine")(repos.mine)
tasks_app.command("synth")(repos.synth)
tasks_app.command("nemo-gym-dataset")(serving.nemo_gym_dataset)

repos_app = typer.Typer(no_args_is_help=True, help="Repositories tasks are made from: register one, list them.")
app.add_typer(repos_app, name="repos")
repos_app.command("add")(repos.add)
repos_app.command("list")(repos.list_repos)

app.command("eval")(evaluation.eval_predictions)
app.command("run")(evaluation.run)
app.command("report")(evaluation.report)
trajectories_app = typer.Typer(no_args_is_help=True, help="Episodes of `patchgym run` as training data.")
app.add_typer(trajectories_app, name="trajectories")
trajectories_app.command("export")(evaluation.export_trajectories)

app.command("serve")(serving.serve)
nemo_gym_app = typer.Typer(no_args_is_help=True, help="Run patchgym as a NeMo Gym resources server.")
app.add_typer(nemo_gym_app, name="nemo-gym")
nemo_gym_app.command("init")(serving.nemo_gym_init)

images_app = typer.Typer(no_args_is_help=True,
                         help="Docker images: a Debian base (debootstrap, no registry), environments, instances.")
app.add_typer(images_app, name="images")
images_app.command("bootstrap")(images.bootstrap)
images_app.command("build")(images.build)
images_app.command("list")(images.list_images)
images_app.command("prune")(images.prune)
sandboxes_app = typer.Typer(no_args_is_help=True, help="Sandboxes left behind by crashed processes.")
app.add_typer(sandboxes_app, name="sandboxes")
sandboxes_app.command("gc")(images.gc)


def main() -> None:
    """The console script: logging as ``PATCHGYM_LOG`` says, and Ctrl-C as exit status 130."""
    from rich.logging import RichHandler

    logging.basicConfig(level=os.environ.get("PATCHGYM_LOG", "WARNING").upper(), format="%(message)s",
                        handlers=[RichHandler(console=console, show_path=False)])
    try:
        app()
    except KeyboardInterrupt:
        console.print("interrupted")
        sys.exit(130)
