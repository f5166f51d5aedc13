"""Which commits share one environment: editable installs depend only on the install inputs."""

from __future__ import annotations

import pytest

from patchgym.sandboxes.install_inputs import install_inputs_digest, shareable_install

BASE = [("pyproject.toml", "a1"), ("README.md", "b1"), ("src/pkg/__init__.py", "c1"), ("src/pkg/core.py", "d1"),
        ("tests/test_core.py", "e1"), ("requirements/dev.txt", "f1")]


def _with(tree, path, blob):
    return sorted([(p, b) for p, b in tree if p != path] + ([(path, blob)] if blob else []))


@pytest.mark.parametrize("commands", [
    ("python -m pip install -e '.[tests]'",),
    ("pip install --no-deps --no-build-isolation -e .",),
    ("pip install --editable=. && pip install -r requirements/dev.txt pytest==8.3.5",),
    ("PIP_NO_INPUT=1 python3 -m pip install -e.",),
    ("python setup.py develop",),
    ("uv pip install -e . -c constraints.txt",),
])
def test_editable_installs_and_named_requirements_are_shareable(commands):
    assert shareable_install(commands)


@pytest.mark.parametrize("commands", [
    ("pip install .",),                          # a copy of the source goes into the venv
    ("python -m pip install '.[test]'",),
    ("pip install -e . && pip install ./vendor/lib",),
    ("pip install file:///testbed",),
    ("python setup.py install",),
    ("python setup.py build_ext --inplace",),
    ("make install",),                          # anything unknown
    ("pip install -e . 'unterminated",),         # does not parse
])
def test_copies_and_unknown_steps_are_per_commit(commands):
    assert not shareable_install(commands)


def test_the_digest_changes_with_install_inputs_only():
    steps = ("pip install -e . -r requirements/dev.txt",)
    base = install_inputs_digest(BASE, steps)
    # Python source and tests changed (a synthesized bug, most fixes): the same environment.
    assert install_inputs_digest(_with(BASE, "src/pkg/core.py", "d2"), steps) == base
    assert install_inputs_digest(_with(BASE, "tests/test_core.py", "e2"), steps) == base
    # What an install reads, or the package layout its import finder maps: another one.
    for changed in (_with(BASE, "pyproject.toml", "a2"), _with(BASE, "requirements/dev.txt", "f2"),
                    _with(BASE, "setup.cfg", "g1"), _with(BASE, "README.md", "b2"),
                    _with(BASE, "src/pkg/_speedups.c", "h1"), _with(BASE, "src/other/__init__.py", "i1"),
                    _with(BASE, "src/extra_module.py", "j1")):
        assert install_inputs_digest(changed, steps) != base, changed
    # A module inside a package comes and goes with its package's directory, which is mapped whole.
    assert install_inputs_digest(_with(BASE, "src/pkg/core.py", None), steps) == base


def test_a_file_an_install_step_names_is_an_input():
    tree = BASE + [("ci/pins.cfg", "k1")]
    steps = ("pip install -e . -c ci/pins.cfg",)
    assert install_inputs_digest(_with(tree, "ci/pins.cfg", "k2"), steps) != install_inputs_digest(tree, steps)
