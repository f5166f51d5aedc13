"""patchgym installs as one import package, ``patchgym``, and works inside a user's project whose
own ``tasks.py`` and ``server/`` sit on ``sys.path`` first (the invoke/celery and web-app
conventions): nothing of patchgym's imports a bare ``tasks`` or ``server``."""

from __future__ import annotations

import json
import shlex
import subprocess
import venv
import zipfile
from pathlib import Path

from conftest import pip_into

ROOT = Path(__file__).resolve().parent.parent
FLOORS = ("sandboxes", "tasks", "grading", "gym_envs", "making", "rollouts", "server", "cli")


def test_the_wheel_holds_one_top_level_package_and_every_subpackage(built_wheel):
    names = zipfile.ZipFile(built_wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"patchgym", "patchgym-0.1.0.dist-info"}
    packages = {str(Path(n).parent) for n in names if n.endswith("/__init__.py")}
    in_tree = {str(Path("patchgym", p.parent.relative_to(ROOT))) for folder in FLOORS
               for p in (ROOT / folder).rglob("__init__.py")} | {"patchgym"}
    assert packages == in_tree, "a package missing from pyproject.toml's [tool.setuptools] packages"
    for data in ("patchgym/tasks/instances/semverkit.jsonl", "patchgym/tasks/repos/semverkit.bundle",
                 "patchgym/tasks/specs/swebench.json", "patchgym/sandboxes/docker/server.c",
                 "patchgym/rollouts/html_report/templates/report.html.j2"):
        assert data in names


def test_the_installed_distribution_adds_only_patchgym_to_site_packages(plain_venv, tmp_path):
    python = plain_venv / "bin" / "python"
    # cwd: away from a checkout, whose egg-info (an editable install's) would be found first
    out = subprocess.run([str(python), "-c", "import importlib.metadata as m, json\n"
                          "print(json.dumps(sorted({f.parts[0] for f in m.files('patchgym')})))"],
                         cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    # `..` is the console script (bin/patchgym), outside site-packages.
    assert set(json.loads(out)) - {".."} == {"patchgym", "patchgym-0.1.0.dist-info"}


def user_project(root: Path) -> Path:
    """A training repository with its own ``tasks.py`` and ``server/`` package, both of which
    fail loudly if anything of patchgym's imports them."""
    root.mkdir()
    (root / "tasks.py").write_text("raise ImportError('the user\\'s tasks.py was imported')\n")
    (root / "server").mkdir()
    (root / "server" / "__init__.py").write_text("raise ImportError('the user\\'s server package was imported')\n")
    return root


def test_gym_make_works_beside_a_users_tasks_and_server_with_no_patchgym_import(plain_venv, calc_tasks_file,
                                                                                 calc_task, tmp_path):
    """The id names the module (Gymnasium 1.x has no plugin entry points): the script imports
    nothing of patchgym, resets RepoEnv on a task, submits the gold patch through bash, and makes
    the remote environment the same way."""
    project = user_project(tmp_path / "project")
    fix = f"printf %s {shlex.quote(calc_task.patch)} | git apply"  # the host's files are not in the sandbox
    script = f"""
import json, sys, gymnasium as gym
env = gym.make("patchgym.gym_envs:patchgym/RepoEnv-v0", tasks={str(calc_tasks_file)!r})
obs, info = env.reset(options={{"task_id": {calc_task.instance_id!r}}})
env.step({{"name": "bash", "arguments": {{"command": {fix!r}}}}})
_, reward, terminated, _, _ = env.step({{"name": "submit", "arguments": {{}}}})
env.close()
remote = gym.make("patchgym.server:patchgym/Remote-v0", url="http://127.0.0.1:9")
print(json.dumps([reward, terminated, type(remote.unwrapped).__name__,
                  sorted(m for m in ("tasks", "server") if m in sys.modules)]))
remote.close()
"""
    proc = subprocess.run([str(plain_venv / "bin" / "python"), "-c", script], cwd=project, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == [1.0, True, "RemoteEnv", []]


def test_an_editable_install_maps_the_folders_into_the_package(tmp_path):
    """``pip install -e .``: the folders are found as ``patchgym``'s subpackages in place."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)  # the suite's pip installs into it (conftest.pip_into)
    python = str(env_dir / "bin" / "python")
    install = subprocess.run(pip_into(env_dir, "install", "-q", "--no-deps", "-e", str(ROOT)),
                             capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-3000:]
    # Modules of the standard library alone (the venv has no dependencies): the package, a floor,
    # a subpackage two levels down, and a data folder.
    out = subprocess.run([python, "-c", "import json, patchgym, patchgym.tasks, patchgym.grading.pytest_runtime as r\n"
                          "print(json.dumps([patchgym.__file__, str(patchgym.tasks.CATALOG_DIR), str(r.RUNTIME_DIR)]))"],
                         cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout) == [str(ROOT / "__init__.py"), str(ROOT / "tasks"),
                                      str(ROOT / "grading" / "pytest_runtime")]
