"""Start-up stays cheap: ``import gym_envs`` and the command line import only what they use, and the
environments are still registered with Gymnasium whichever of the two is imported first.

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


def test_import_gym_envs_leaves_gymnasium_alone_and_registers_when_it_arrives():
    got = fresh("import json, sys, gym_envs\n"
                "before = sorted(m for m in ('gymnasium', 'numpy', 'pydantic', 'sandboxes', 'tasks') if m in sys.modules)\n"
                "import gymnasium\n"
                "print(json.dumps([before, [i for i in gymnasium.registry if i.startswith('patchgym/')]]))")
    assert got == [[], IDS]


def test_gymnasium_imported_first_registers_at_once():
    assert fresh("import json, gymnasium, gym_envs\n"
                 "print(json.dumps([i for i in gymnasium.registry if i.startswith('patchgym/')]))") == IDS


def test_a_submodule_import_of_gymnasium_registers_too():
    assert fresh("import json, gym_envs\n"
                 "from gymnasium.envs.registration import registry\n"
                 "print(json.dumps([i for i in registry if i.startswith('patchgym/')]))") == IDS


def test_gymnasium_imports_the_package_a_prefixed_id_names():
    assert fresh("import json, gymnasium\n"
                 "env = gymnasium.make('gym_envs:patchgym/PatchEnv-v0')\n"
                 "print(json.dumps(env.spec.id))") == IDS[1]


def test_the_command_line_imports_no_layer_before_a_command_needs_it():
    heavy = ["gymnasium", "numpy", "httpx", "docker", "pydantic", "sandboxes", "tasks", "gym_envs", "server"]
    loaded = fresh(f"import json, sys, cli\nprint(json.dumps([m for m in {heavy!r} if m in sys.modules]))")
    assert loaded == []


def test_the_help_texts_backends_and_releases_are_the_real_ones():
    from sandboxes.docker.images import RELEASES

    assert BACKENDS == backends.BACKENDS
    assert DEBIAN_RELEASES == RELEASES
