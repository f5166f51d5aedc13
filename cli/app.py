"""The ``patchgym`` command tree: every group and command is mounted here, from the module named after
it (``patchgym tasks ...`` from :mod:`patchgym.cli.tasks`, ``patchgym eval`` from :mod:`patchgym.cli.eval`,
and so on), so this file is the whole command line at a glance."""

from __future__ import annotations

import logging
import os
import signal
import sys

import typer

from patchgym.cli import images, nemo_gym, repos, sandboxes, tasks, trajectories
from patchgym.cli.common import console, interrupt_hint, show_phases
from patchgym.cli.eval import eval_predictions
from patchgym.cli.report import report
from patchgym.cli.run import run
from patchgym.cli.serve import serve

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="SWE-bench-style verifiable-reward environments.")
# The top-level commands, by function: their modules are named after them, and a module bound to
# the name ``eval`` here would hide the builtin.
for _name, _command in (("eval", eval_predictions), ("run", run), ("report", report), ("serve", serve)):
    app.command(_name)(_command)

# Each group: its help, and its commands in the order --help lists them.
GROUPS = {
    "tasks": ("Browse, validate, import, export and make task sets.", [
        ("list", tasks.list_tasks), ("show", tasks.show), ("validate", tasks.validate),
        ("import-swebench", tasks.import_swebench), ("export", tasks.export), ("mine", tasks.mine),
        ("synth", tasks.synth), ("nemo-gym-dataset", tasks.nemo_gym_dataset)]),
    "repos": ("Repositories tasks are made from: register one, list them.", [
        ("add", repos.add), ("list", repos.list_repos)]),
    "trajectories": ("Episodes of `patchgym run` as training data.", [
        ("export", trajectories.export_trajectories)]),
    "nemo-gym": ("Run patchgym as a NeMo Gym resources server.", [("init", nemo_gym.nemo_gym_init)]),
    "images": ("Docker images: a Debian base (debootstrap, no registry), environments, instances.", [
        ("bootstrap", images.bootstrap), ("build", images.build), ("list", images.list_images),
        ("prune", images.prune), ("python-archive", images.python_archive)]),
    "sandboxes": ("Sandboxes left behind by crashed processes.", [("gc", sandboxes.gc)]),
}
for _name, (_help, _commands) in GROUPS.items():
    _group = typer.Typer(no_args_is_help=True, help=_help)
    app.add_typer(_group, name=_name)
    for _command_name, _command in _commands:
        _group.command(_command_name)(_command)


def main() -> None:
    """The console script: logging as ``PATCHGYM_LOG`` says (and the long steps' phases always), and
    Ctrl-C as exit status 130, said at once in one line with how to resume when the command knows
    (``common.say_on_interrupt``), before the work under way winds down."""
    from rich.logging import RichHandler

    # On a terminal rich's columns; in a log plain lines (rich pads each record to the console's width).
    handler = (RichHandler(console=console, show_path=False) if console.is_terminal
               else logging.StreamHandler(console.file))
    if not console.is_terminal:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=os.environ.get("PATCHGYM_LOG", "WARNING").upper(), format="%(message)s",
                        handlers=[handler])
    show_phases()
    said: list[str] = []

    def interrupted(signum: int, frame: object) -> None:
        from patchgym.sandboxes.phases import stop

        stop()  # the work under way finishes, but builds start no further step
        hint = interrupt_hint()
        if hint and not said:
            said.append(hint)
            console.print(f"interrupted: {hint}", markup=False, highlight=False)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupted)
    try:
        app()
    except KeyboardInterrupt:
        if not said:
            console.print("interrupted")
        sys.exit(130)
