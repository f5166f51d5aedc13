"""Start-up stays cheap: ``import patchgym`` and the command line import only what they use, grading
never imports Gymnasium, and the environments are registered by their own package or by Gymnasium
from a module-qualified id.

Timing lives in bench/startup.py; these tests pin the imports the timing depends on, in fresh
interpreters (this process has imported everything already).
"""

from __future__ import annotations

import json
import subprocess
import sys

from patchgym.cli.common import BACKENDS, DEBIAN_RELEASES
from patchgym.tasks import backends

IDS = ["patchgym/RepoEnv-v0", "patchgym/PatchEnv-v0"]


def fresh(code: str) -> dict:
    """Run ``code`` in a new interpreter; it prints one JSON value, returned here."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_patchgym_imports_none_of_its_floors():
    got = fresh("import json, sys, patchgym\n"
                "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('patchgym.', 'gymnasium', 'numpy', "
                "'pydantic')))))")
    assert got == []


def test_the_eval_path_never_imports_gymnasium():
    """Grading is not under the environments' package, so ``patchgym eval`` pays nothing for
    Gymnasium and NumPy (bench/startup.py's eval figures)."""
    got = fresh("import json, sys\n"
                "import patchgym.cli.common, patchgym.grading.evaluation, patchgym.grading.verifier\n"
                "import patchgym.tasks.backends, patchgym.tasks.predictions\n"
                "print(json.dumps([m for m in ('gymnasium', 'numpy', 'patchgym.gym_envs') if m in sys.modules]))")
    assert got == []


def test_importing_the_environments_registers_them():
    assert fresh("import json, gymnasium, patchgym.gym_envs\n"
                 "print(json.dumps([i for i in gymnasium.registry if i.startswith('patchgym/')]))") == IDS


def test_gymnasium_imports_the_package_a_module_qualified_id_names():
    """No patchgym import: Gymnasium 1.x imports the module named before the colon, which registers."""
    assert fresh("import json, gymnasium\n"
                 "env = gymnasium.make('patchgym.gym_envs:patchgym/PatchEnv-v0')\n"
                 "print(json.dumps(env.spec.id))") == IDS[1]
    assert fresh("import json, gymnasium\n"  # a closed port: making the env sends nothing yet
                 "env = gymnasium.make('patchgym.server:patchgym/Remote-v0', url='http://127.0.0.1:9')\n"
                 "print(json.dumps(type(env.unwrapped).__name__)); env.close()") == "RemoteEnv"


def test_nothing_patches_gymnasiums_import():
    got = fresh("import json, sys, patchgym, patchgym.gym_envs, patchgym.server\n"
                "print(json.dumps([type(f).__module__ for f in sys.meta_path if 'patchgym' in type(f).__module__]))")
    assert got == []


def test_the_command_line_imports_no_floor_before_a_command_needs_it():
    heavy = ["gymnasium", "numpy", "httpx", "docker", "pydantic", "patchgym.sandboxes", "patchgym.tasks",
             "patchgym.grading", "patchgym.gym_envs", "patchgym.making", "patchgym.rollouts", "patchgym.server"]
    loaded = fresh(f"import json, sys, patchgym.cli\nprint(json.dumps([m for m in {heavy!r} if m in sys.modules]))")
    assert loaded == []


def test_the_help_texts_backends_and_releases_are_the_real_ones():
    from patchgym.sandboxes.docker.images import RELEASES

    assert BACKENDS == backends.BACKENDS
    assert DEBIAN_RELEASES == RELEASES
