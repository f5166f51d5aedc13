"""Automatic environments (making/auto_env.py): candidate recipes read from a repository's
declarations, tried in order until the tests collect at the base commit."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest
from conftest import PYTEST_PIN
from packaging.version import Version
from test_repo_setup import commit

from patchgym.grading.testrun import probe_task
from patchgym.making import auto_env
from patchgym.making.git_source import RepoFiles
from patchgym.sandboxes import SandboxError
from patchgym.sandboxes.base import ExecResult
from patchgym.tasks.backends import sandbox_factory

LIB = {"tinylib/__init__.py": "def add(a, b):\n    return a + b\n"}
TESTS = {"tests/test_add.py": "from tinylib import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"}
NEEDS_HELPER = {"tests/conftest.py": "import six  # only a test requirement brings it\n"}


def helper_package(tmp_path: Path) -> str:
    """A small pure-Python package the tests import and only a test requirement installs."""
    return "six==1.16.0"


def files_at(repo: Path, sha: str) -> RepoFiles:
    return RepoFiles(repo / ".git", sha)


def task_for(repo: Path, sha: str, tests: list[str]):
    return probe_task(repo="local/tinylib", base_commit=sha, repo_path=str(repo), instance_id="tinylib-1").model_copy(
        update={"FAIL_TO_PASS": tests, "PASS_TO_PASS": []})


# --- reading the declarations ---------------------------------------------------------------------


def test_recipes_come_from_every_declaration_and_setup_py_is_not_run(tmp_path):
    repo = tmp_path / "repo"
    sha = commit(repo, {**LIB, **TESTS,
                        "setup.py": "import os\nos.system('touch /tmp/pwned-by-setup-py')\nfrom setuptools import setup\n"
                                    "setup(name='tinylib', python_requires='>=3.8',\n"
                                    "      extras_require={'test': ['pytest', 'hypothesis'], 'dev': ['black']})\n",
                        "requirements-dev.txt": "pytest-mock\n",
                        "tox.ini": "[testenv]\ndeps =\n    -r requirements-dev.txt\n    coverage\n",
                        "noxfile.py": "import nox\n@nox.session\ndef tests(session):\n"
                                      "    session.install('-e', '.', 'freezegun')\n    session.run('pytest')\n",
                        ".github/workflows/ci.yml": "jobs:\n  t:\n    steps:\n      - run: pip install responses tox\n"})
    with files_at(repo, sha) as files:
        recipes = auto_env.candidate_recipes(files, resolver=None)
    names = [r.name.split(" (")[0] for r in recipes]
    assert names[0] == "declared"
    first = recipes[0].environment
    assert first.install == ["python -m pip install -e '.[test]'"]
    assert {"extra dev", "requirements-dev.txt", "tox.ini [testenv] deps", "noxfile.py session.install"} <= set(names)
    by_name = {r.name.split(" (")[0]: r.environment for r in recipes}
    assert "freezegun" in by_name["noxfile.py session.install"].packages
    assert {"pytest-mock", "coverage"} <= set(by_name["tox.ini [testenv] deps"].packages)
    assert by_name["extra dev"].install == ["python -m pip install -e '.[dev]'"]
    assert not Path("/tmp/pwned-by-setup-py").exists()


def test_as_of_twins_resolve_every_requirement_at_the_commit_date(tmp_path):
    repo = tmp_path / "repo"
    sha = commit(repo, {**LIB, **TESTS, "setup.cfg": "[metadata]\nname = tinylib\n[options]\ninstall_requires =\n"
                                                    "    click\n[options.extras_require]\ntest =\n    pytest\n",
                        "setup.py": "from setuptools import setup\nsetup()\n",
                        "pyproject.toml": '[build-system]\nrequires = ["setuptools", "setuptools_scm"]\n'})
    asked = []

    def resolver(requirements, python, date):
        asked.append((requirements, python, date))
        if python != "3.9":
            raise auto_env.ResolveError(f"no click for {python} then")
        return [f"{r.split('=')[0]}==1.0" for r in requirements]

    when = datetime(2020, 5, 1, tzinfo=timezone.utc)
    with files_at(repo, sha) as files:
        recipes = auto_env.candidate_recipes(files, version="2.1", as_of=when, resolver=resolver,
                                             pythons=("3.9", "3.11", "3.12"))
    dated = [r for r in recipes if "as of 2020-05-01" in r.name]
    assert dated and recipes[0] is dated[0], [r.name for r in recipes]  # before the recipe it twins
    assert recipes[1].name == dated[0].name.replace(" as of 2020-05-01", "")
    assert not asked  # nothing is resolved before a recipe is tried
    # a checkout has no tags: the row's version stands in for them
    assert dated[0].environment.install[0].startswith("SETUPTOOLS_SCM_PRETEND_VERSION=2.1.0 python -m pip install")

    tried = []

    def factory(task):
        tried.append(task.environment)
        raise SandboxError("no")

    task = probe_task(repo="local/x", base_commit=sha, instance_id="x-1")
    assert "python 3.9" in dated[0].name  # none was out in 2020-05: the oldest is the nearest to then
    other = next(r for r in dated if "python 3.9" not in r.name)
    report = auto_env.choose_environment(task, [dated[0], other], factory)
    assert "click" in asked[0][0] and "pytest" in asked[0][0]  # the project's own requirements too
    assert tried[0].packages and all(p.endswith("==1.0") for p in tried[0].packages)
    assert report.attempts[-1].reason.startswith("not resolved: no click for 3.")


class FakeSandbox:
    def __init__(self, ok: bool):
        self.ok, self.commands, self.closed = ok, [], False

    def exec(self, command, timeout=60.0, **_):
        self.commands.append(command)
        return ExecResult(0 if self.ok else 2, "" if self.ok else "E   ModuleNotFoundError: No module named 'x'",
                          False, 0.1)

    def close(self):
        self.closed = True


def test_recipes_are_tried_in_order_and_each_failure_is_kept(tmp_path):
    recipes = [auto_env.Recipe(name, auto_env.EnvironmentConfig(packages=[name])) for name in ("a", "b", "c", "d")]
    made = []

    def factory(task):
        name = task.environment.packages[0]
        if name == "a":
            raise SandboxError("pip install failed\nERROR: No matching distribution found for a")
        made.append(FakeSandbox(ok=name == "c"))
        return made[-1]

    task = probe_task(repo="local/x", base_commit="0" * 40, instance_id="x-1")
    report = auto_env.choose_environment(task, recipes, factory, tests=["tests/test_x.py"])
    assert [a.recipe.name for a in report.attempts] == ["a", "b", "c"]  # d is never built
    assert report.winner is recipes[2]
    assert "build failed" in report.attempts[0].reason and "No matching distribution" in report.attempts[0].reason
    assert "No module named 'x'" in report.attempts[1].reason
    assert all(s.closed for s in made)
    assert made[0].commands == [f"{auto_env.COLLECT} tests/test_x.py"]
    assert "c: collected" in report.summary()


# --- building them (local backend) ----------------------------------------------------------------


@pytest.mark.slow
def test_requirements_dev_wins_when_the_test_requirements_fall_short(tmp_path):
    repo = tmp_path / "repo"
    helper = helper_package(tmp_path)
    sha = commit(repo, {**LIB, **TESTS, **NEEDS_HELPER,
                        "pyproject.toml": '[build-system]\nrequires = ["setuptools"]\nbuild-backend = '
                                          '"setuptools.build_meta"\n[project]\nname = "tinylib"\nversion = "0.1"\n'
                                          '[tool.setuptools]\npackages = ["tinylib"]\n',
                        "requirements/test.txt": f"{PYTEST_PIN}\n",  # the first choice, missing the helper
                        "requirements-dev.txt": f"{PYTEST_PIN}\n{helper}\n"})
    task = task_for(repo, sha, ["tests/test_add.py::test_add"])
    with files_at(repo, sha) as files:
        recipes = auto_env.candidate_recipes(files, resolver=None, pythons=())
        tests = auto_env.task_tests(task, files)
    report = auto_env.choose_environment(task, recipes, sandbox_factory("local"), tests=tests, timeout=120)
    assert report.winner is not None, report.summary()
    assert report.winner.name.startswith("requirements-dev.txt"), report.summary()
    assert "No module named 'six'" in report.attempts[0].reason


@pytest.mark.slow
def test_python_requires_that_excludes_the_default_picks_an_interpreter_it_allows(tmp_path):
    from patchgym.sandboxes import EnvironmentSpec
    from patchgym.sandboxes.environments import find_interpreter

    try:
        find_interpreter(EnvironmentSpec(python="<3.11,>=3.8"))
    except SandboxError:
        pytest.skip("no Python older than 3.11 on this machine")
    repo = tmp_path / "repo"
    sha = commit(repo, {**LIB, **TESTS,
                        "tests/conftest.py": "import sys\nif sys.version_info >= (3, 11):\n"
                                             "    raise ImportError('this project predates Python 3.11')\n",
                        "setup.py": "from setuptools import setup\nsetup(name='tinylib', packages=['tinylib'],\n"
                                    "      python_requires='>=3.8,<3.11')\n"})
    task = task_for(repo, sha, ["tests/test_add.py::test_add"])
    with files_at(repo, sha) as files:
        recipes = auto_env.candidate_recipes(files, resolver=None)
        tests = auto_env.task_tests(task, files)
    assert recipes and all(Version(r.environment.python) < Version("3.11") for r in recipes)
    report = auto_env.choose_environment(task, recipes, sandbox_factory("local"), tests=tests, timeout=120)
    assert report.winner is recipes[0], report.summary()


@pytest.mark.slow
def test_import_swebench_chooses_an_environment_for_a_repository_no_spec_covers(tmp_path):
    """Its tests import what only its `test` extra installs."""
    import json

    from typer.testing import CliRunner

    from patchgym.cli import app

    repos = tmp_path / "repos"
    repo = repos / "acme__tinylib"
    sha = commit(repo, {**LIB, **TESTS, **NEEDS_HELPER,
                        "pyproject.toml": '[build-system]\nrequires = ["setuptools"]\nbuild-backend = '
                                          '"setuptools.build_meta"\n[project]\nname = "tinylib"\nversion = "0.1"\n'
                                          f'[project.optional-dependencies]\ntest = ["{PYTEST_PIN}", "six==1.16.0"]\n'
                                          '[tool.setuptools]\npackages = ["tinylib"]\n'})
    row = {"repo": "acme/tinylib", "instance_id": "acme__tinylib-1", "base_commit": sha, "patch": "",
           "test_patch": "", "problem_statement": "p", "version": "0.1", "created_at": "2026-01-01",
           "FAIL_TO_PASS": json.dumps(["tests/test_add.py::test_add"]), "PASS_TO_PASS": "[]"}
    source, output, report = tmp_path / "rows.jsonl", tmp_path / "tasks.jsonl", tmp_path / "auto.jsonl"
    source.write_text(json.dumps(row) + "\n")
    result = CliRunner().invoke(app, ["tasks", "import-swebench", str(source), "--repos", str(repos), "--output",
                                      str(output), "--no-validate", "--auto-env", "--auto-report", str(report)],
                                catch_exceptions=False)
    text = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    assert "environments: 1 from auto" in text and "declared" in text and "collected" in text
    task = json.loads(output.read_text())
    assert task["environment"]["install"] == ["python -m pip install -e '.[test]'"]
    choice = json.loads(report.read_text())
    assert choice["winner"].startswith("declared") and choice["attempts"][0]["ok"]


def test_the_python_of_the_commits_time_is_tried_first():
    when = datetime(2021, 6, 1, tzinfo=timezone.utc)
    assert auto_env.era_python(["3.11", "3.9"], when) == "3.9"
    assert auto_env.era_python(["3.11", "3.9"], datetime(2024, 1, 1, tzinfo=timezone.utc)) == "3.11"
    assert auto_env.era_python(["3.11", "3.9"], datetime(2015, 1, 1, tzinfo=timezone.utc)) == "3.9"  # the nearest
    assert auto_env.era_python(["3.11"], None) is None


def test_a_development_requirement_uv_cannot_resolve_is_left_out_but_a_runtime_one_is_not(tmp_path):
    """sqlfluff's requirements_dev.txt names types-pkg_resources, every release of which is yanked:
    the whole recipe failed, as of the commit and as declared, for a type stub no test imports."""
    repo = tmp_path / "repo"
    sha = commit(repo, {**LIB, **TESTS, "setup.py": "from setuptools import setup\n"
                                                    "setup(name='tinylib', install_requires=['click>=7'])\n",
                        "requirements_dev.txt": "pytest\nhypothesis\ntypes-pkg_resources\n"})
    yanked = ("error: No solution found when resolving dependencies: cause: Because types-pkg-resources<=0.1.2 "
              "was yanked (reason: Use types-setuptools instead) and only the following versions of "
              "types-pkg-resources are available: types-pkg-resources<=0.1.2")
    asked = []

    def resolver(requirements, python, date):
        asked.append(list(requirements))
        names = [r.split(">")[0].split("=")[0] for r in requirements]
        if "types-pkg_resources" in names:
            raise auto_env.ResolveError(yanked)
        if "click" in names and python == "3.11":
            raise auto_env.ResolveError("error: No solution found: cause: Because there are no versions of click>=7 "
                                        "and you require click>=7, we can conclude that your requirements are unsatisfiable.")
        return [f"{n}==1.0" for n in names]

    when = datetime(2021, 10, 13, tzinfo=timezone.utc)
    with files_at(repo, sha) as files:
        recipes = auto_env.candidate_recipes(files, as_of=when, resolver=resolver, pythons=("3.9", "3.11"))
    first = recipes[0]
    assert first.name.startswith("declared as of 2021-10-13 (python 3.9)")
    environment = first.resolve()
    assert environment.packages == ["click==1.0", "pytest==1.0", "hypothesis==1.0"]
    assert len(asked) == 2 and "types-pkg_resources" in asked[0]
    assert any("left out types-pkg-resources" in n for n in first.notes)
    # a requirement of the project itself is never left out: the resolution fails, said as uv said it
    on_311 = next(r for r in recipes if r.resolve and "python 3.11" in r.name)
    with pytest.raises(auto_env.ResolveError, match="no versions of click"):
        on_311.resolve()


def test_resolving_as_of_a_date_takes_a_release_the_date_hides_when_none_before_it_is_left():
    """atomicwrites' releases before 2022-07 were deleted from PyPI: as of 2019, uv backtracked to
    pytest 3.5.1 (the last without it) for marshmallow, or found no solution for pytest 4.x."""
    import subprocess

    calls = []
    hint = ("error: No solution found when resolving dependencies\n  cause: Because there are no versions of "
            "atomicwrites and pytest>=4.0.0 depends on atomicwrites>=1.0, we can conclude ...\n\nhint: "
            "`pluggy` was filtered by `exclude-newer` to only include packages uploaded before "
            "2019-08-20T09:44:59Z. The latest version satisfying the requirement is v0.13.0, published at "
            "2019-09-01T10:00:00.123Z.\n")

    def run(argv, **_):
        calls.append(argv)
        if len(calls) == 1:
            return subprocess.CompletedProcess(argv, 1, "", "warning: no managed Python\n" + hint)
        return subprocess.CompletedProcess(argv, 0, "# header\npluggy==0.13.0\npytest==4.6.5\n", "")

    when = datetime(2019, 8, 20, 9, 44, 59, tzinfo=timezone.utc)
    pins = auto_env.resolve_as_of(["pytest==4.6.5"], "3.9", when, run=run)
    assert pins == ["pluggy==0.13.0", "pytest==4.6.5"]
    assert "--exclude-newer" in calls[0] and "2019-08-20T09:44:59Z" in calls[0]
    assert any(a.startswith("--exclude-newer-package=atomicwrites=") for a in calls[0])  # from the start
    assert "--exclude-newer-package=pluggy=2019-09-01T10:01:00Z" in calls[1]

    def never(argv, **_):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 1, "", "warning: no managed Python\n" + hint)

    calls.clear()
    with pytest.raises(auto_env.ResolveError, match="No solution found") as failed:
        auto_env.resolve_as_of(["pytest==4.6.5"], "3.9", when, run=never)
    assert len(calls) == 2 and "warning" not in str(failed.value)  # tried once more, then uv's reason


def test_a_commit_older_than_its_python_gets_the_first_wheels_for_it_else_builds_the_sdist():
    """xarray of 2019 on Python 3.9: numpy 1.17 and pandas 0.25 have no cp39 wheel, and the build
    compiled them for many minutes; the releases that first had wheels for 3.9 are taken instead,
    and a project that never published a wheel (old pure-Python ones) is still built from source."""
    import subprocess

    def no_wheels(name):
        return (f"error: No solution found when resolving dependencies\n  cause: Because {name}>=1.14.0 has no "
                f"usable wheels and you require {name}>=1.14, we can conclude ...\n\nhint: Wheels are required "
                f"for `{name}` because building from source is disabled for all packages (i.e., with `--no-build`)\n")

    calls = []

    def run(argv, **_):
        calls.append(argv)
        if len(calls) <= 2:  # numpy: none as of the commit, none 90 days after 3.9 either (say)
            return subprocess.CompletedProcess(argv, 1, "", no_wheels("numpy"))
        return subprocess.CompletedProcess(argv, 0, "numpy==1.17.2\n", "")

    when = datetime(2019, 10, 12, tzinfo=timezone.utc)
    assert auto_env.resolve_as_of(["numpy>=1.14"], "3.9", when, run=run) == ["numpy==1.17.2"]
    first, second, third = (" ".join(a) for a in calls)
    assert "--only-binary :all:" in first and "numpy" not in first.replace("numpy>=", "")
    assert "--exclude-newer-package=numpy=2021-01-03T00:00:00Z" in second  # 3.9's release + 90 days
    assert "--no-binary=numpy" in third and "--exclude-newer-package=numpy" not in third

    # a commit newer than its Python's first wheels: built from source as of the commit at once
    calls.clear()
    later = datetime(2022, 3, 1, tzinfo=timezone.utc)
    auto_env.resolve_as_of(["numpy>=1.14"], "3.9", later, run=lambda argv, **kw: (
        calls.append(argv), subprocess.CompletedProcess(argv, *((1, "", no_wheels("numpy")) if len(calls) == 1
                                                               else (0, "numpy==1.22.2\n", ""))))[1])
    assert len(calls) == 2 and "--no-binary=numpy" in calls[1] and "--exclude-newer-package=numpy" not in " ".join(calls[1])


def test_an_extra_built_from_others_in_setup_py_is_read_and_tried_before_another_python(tmp_path):
    """marshmallow 2.20's conftest imports simplejson, which only its `dev` extra brings, and that
    extra is set after the dict: EXTRAS_REQUIRE['dev'] = EXTRAS_REQUIRE['reco'] + ... ."""
    repo = tmp_path / "repo"
    sha = commit(repo, {**LIB, **TESTS, "setup.py": (
        "from setuptools import setup\n"
        "EXTRAS_REQUIRE = {'reco': ['simplejson'], 'tests': ['pytest', 'pytz'], 'lint': ['flake8']}\n"
        "EXTRAS_REQUIRE['dev'] = (EXTRAS_REQUIRE['reco'] + EXTRAS_REQUIRE['tests'] + EXTRAS_REQUIRE['lint']\n"
        "                         + ['tox'])\n"
        "setup(name='tinylib', extras_require=EXTRAS_REQUIRE)\n")})
    with files_at(repo, sha) as files:
        assert auto_env._extras(files)["dev"] == ["simplejson", "pytest", "pytz", "flake8", "tox"]
        recipes = auto_env.candidate_recipes(files, resolver=None, pythons=("3.9", "3.11"),
                                             as_of=datetime(2019, 8, 10, tzinfo=timezone.utc))
    names = [r.name for r in recipes]
    assert names[:2] == ["declared (python 3.9)", "extra dev (python 3.9)"], names  # not 3.11 first
    assert recipes[1].environment.install == ["python -m pip install -e '.[dev]'"]
    assert names[-1] == "declared (python 3.11)"


def test_setup_py_subscripts_cannot_recurse_forever():
    from patchgym.making.repo_setup import setup_py_keywords

    text = "E = {'a': ['x']}\nE['b'] = E['b'] + E['a']\nE['a'] = E['b']\nfrom setuptools import setup\n" \
           "setup(extras_require=E, install_requires=['y'])\n"
    assert setup_py_keywords(text)["install_requires"] == ["y"]  # the unreadable extras are left out, no hang


def test_what_must_collect_is_the_listed_files_or_where_a_new_one_goes(tmp_path):
    repo = tmp_path / "repo"
    sha = commit(repo, {**LIB, **TESTS, "test/rules/std_test.py": "def test_a():\n    pass\n",
                        "plugins/dbt/test/templater_test.py": "def test_b():\n    pass\n"})
    with files_at(repo, sha) as files:
        def tests(*ids):
            return auto_env.task_tests(task_for(repo, sha, list(ids)), files)

        assert tests("test/rules/std_new_test.py::test_x") == ["test/rules"]  # added by the test patch
        assert tests("tests/test_add.py::test_add", "test/rules/std_new_test.py::test_x") == \
            ["tests/test_add.py", "test/rules"]
        assert tests("test_new.py::test_x") == []  # at the top: the whole suite
