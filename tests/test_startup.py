"""Start-up stays cheap: ``import gym_envs`` registers the environments with Gymnasium and imports
nothing else of the project, and the command line imports no layer before a command needs it.

Timing lives in bench/startup.py; these tests pin the imports the timing depends on, in fresh
interpreters (this process has imported everything already).
"""

from __future__ import annotations

import json
import subprocess
import sys

from cli.common import BACKENDS, DEBIAN_RELEASES
from tasks import backends

IDS = ["patchgym/RepoEnv-v0", "patchgym/PatchEnv-v0"]


def fresh(code: str) -> dict:
    """Run ``code`` in a new interpreter; it prints one JSON value, returned here."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_gym_envs_registers_the_environments():
    assert fresh("import json, gym_envs, gymnasium\n"
                 "print(json.dumps([i for i in gymnasium.registry if i.startswith('patchgym/')]))") == IDS


def test_gymnasium_imports_the_package_a_prefixed_id_names():
    assert fresh("import json, gymnasium\n"
                 "env = gymnasium.make('gym_envs:patchgym/PatchEnv-v0')\n"
                 "print(json.dumps(env.spec.id))") == IDS[1]


def test_import_gym_envs_leaves_the_environments_and_the_layers_unimported():
    heavy = ["pydantic", "httpx", "docker", "sandboxes", "tasks", "gym_envs.grading", "gym_envs.envs.repo_env"]
    assert fresh(f"import json, sys, gym_envs\nprint(json.dumps([m for m in {heavy!r} if m in sys.modules]))") == []


def test_the_command_line_imports_no_layer_before_a_command_needs_it():
    heavy = ["gymnasium", "numpy", "httpx", "docker", "pydantic", "sandboxes", "tasks", "gym_envs", "server"]
    loaded = fresh(f"import json, sys, cli\nprint(json.dumps([m for m in {heavy!r} if m in sys.modules]))")
    assert loaded == []


def test_the_help_texts_backends_and_releases_are_the_real_ones():
    from sandboxes.docker.images import RELEASES

    assert BACKENDS == backends.BACKENDS
    assert DEBIAN_RELEASES == RELEASES
