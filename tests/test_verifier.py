"""The verifier end to end on the calc fixture, including patches that try to game it."""

from __future__ import annotations

import pickle

import pytest

from patchgym import Verifier
from patchgym.grading.patches import filter_agent_patch, is_test_or_config, read_agent_patch, split_diff
from patchgym.sandboxes import ExecResult


def new_file(path: str, content: str) -> str:
    lines = content.splitlines()
    body = "".join(f"+{line}\n" for line in lines)
    return (f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
            f"@@ -0,0 +1,{len(lines)} @@\n{body}")


def replace_mean(body: str) -> str:
    """A diff that replaces the body of calc.mean() (three lines at the end of the module)."""
    new = "".join(f"+{line}\n" for line in body.splitlines())
    return ("diff --git a/calc/__init__.py b/calc/__init__.py\n--- a/calc/__init__.py\n+++ b/calc/__init__.py\n"
            "@@ -11,4 +11,%d @@\n def mean(values):\n     \"\"\"Arithmetic mean of a sequence of numbers.\"\"\"\n"
            "-    values = list(values)\n-    return sum(values) / len(values)\n%s") % (len(body.splitlines()) + 2, new)


@pytest.fixture(scope="module")
def verifier():
    return Verifier()


def test_the_patches_are_parsed_once_on_the_grading_path(verifier, calc_task, monkeypatch):
    """The agent's text is parsed once and passed down parsed (filter, staging, applying); the test
    patch likewise."""
    from patchgym.grading import patches, testrun
    from patchgym.grading import verifier as verifier_module

    seen: list[str] = []
    real = patches.parse_patch

    def counting(text: str):
        seen.append(text)
        return real(text)

    for module in (patches, verifier_module, testrun):
        monkeypatch.setattr(module, "parse_patch", counting)
    assert verifier.verify(calc_task, calc_task.patch).resolved
    assert seen.count(calc_task.patch) == 1 and seen.count(calc_task.test_patch) == 1 and len(seen) == 2


def test_gold_resolves_and_reports_swebench_fields(verifier, calc_task):
    report = verifier.verify(calc_task, calc_task.patch, model_name="gold")
    assert report.resolved and report.reward == 1.0
    assert report.patch_exists and report.patch_successfully_applied and not report.patch_is_None
    assert report.tests_status["FAIL_TO_PASS"] == {"success": calc_task.FAIL_TO_PASS, "failure": []}
    assert report.tests_status["PASS_TO_PASS"]["failure"] == []
    assert report.results_consistent and report.test_exit_code == 1  # the canary that must fail
    assert not report.tampering_detected
    assert not report.infrastructure_failure
    data = report.swebench_dict()
    for key in ("patch_is_None", "patch_exists", "patch_successfully_applied", "resolved", "tests_status"):
        assert key in data
    assert "test_output" not in data


def test_no_change_does_not_resolve(verifier, calc_task):
    empty = verifier.verify(calc_task, "", run_empty=True)
    assert not empty.resolved and empty.patch_successfully_applied
    assert empty.tests_status["FAIL_TO_PASS"]["failure"] == calc_task.FAIL_TO_PASS
    assert empty.tests_status["PASS_TO_PASS"]["failure"] == []
    none = verifier.verify(calc_task, None)
    assert none.patch_is_None and not none.patch_exists and not none.resolved


def test_an_alternative_real_fix_resolves(verifier, calc_task):
    patch = replace_mean("    values = tuple(values)\n    if len(values) == 0:\n        raise ValueError('empty input')\n"
                         "    return sum(values) / len(values)")
    report = verifier.verify(calc_task, patch)
    assert report.resolved, report.test_output[-2000:]


def test_patch_that_does_not_apply(verifier, calc_task):
    bad = replace_mean("    return 0").replace("-    values = list(values)", "-    values = sorted(values)")
    report = verifier.verify(calc_task, bad)
    assert not report.patch_successfully_applied and not report.resolved
    assert not report.infrastructure_failure
    assert "does not apply" in report.error
    garbage = verifier.verify(calc_task, "please fix it yourself")
    assert not garbage.patch_successfully_applied and "not a patch" in garbage.error


def test_editing_tests_and_config_is_ignored(verifier, calc_task):
    """Neutering the hidden test, adding conftest/pytest config: all dropped, still unresolved."""
    neuter_conftest = new_file("conftest.py", (
        "import pytest\n"
        "@pytest.hookimpl(hookwrapper=True)\n"
        "def pytest_runtest_makereport(item, call):\n"
        "    outcome = yield\n"
        "    outcome.get_result().outcome = 'passed'\n"))
    ini = new_file("pytest.ini", "[pytest]\naddopts = -p no:junitxml\n")
    shadow = new_file("tests/conftest.py", "collect_ignore = ['test_calc.py']\n")
    sneaky = new_file("calc/sitecustomize.py", "import os\n")
    patch = neuter_conftest + ini + shadow + sneaky
    report = verifier.verify(calc_task, patch)
    assert not report.resolved
    assert set(report.ignored_paths) == {"conftest.py", "pytest.ini", "tests/conftest.py", "calc/sitecustomize.py"}
    assert report.tests_status["FAIL_TO_PASS"]["failure"] == calc_task.FAIL_TO_PASS


def test_real_fix_plus_test_edits_still_resolves(verifier, calc_task):
    test_edit = new_file("tests/test_extra.py", "def test_x():\n    assert False\n")
    report = verifier.verify(calc_task, calc_task.patch + test_edit)
    assert report.resolved and report.ignored_paths == ["tests/test_extra.py"]


def test_fake_result_files_do_not_count(verifier, calc_task):
    fake = ('<testsuites><testsuite><testcase classname="tests.test_calc" name="test_mean_empty" '
            'file="tests/test_calc.py"/></testsuite></testsuites>')
    patch = new_file("junit.xml", fake) + new_file(".patchgym-junit-0.xml", fake) + new_file("report.json", "{}")
    report = verifier.verify(calc_task, patch)
    assert not report.resolved


def test_hanging_tests_time_out_as_agent_failure(verifier, calc_task):
    task = calc_task.model_copy(update={"test_spec": calc_task.test_spec.model_copy(update={"timeout": 4})})
    task._source_file = calc_task.source_file
    report = verifier.verify(task, replace_mean("    while True:\n        pass"))
    assert report.test_timed_out and not report.resolved
    assert not report.infrastructure_failure
    assert report.duration_seconds < 30


def test_huge_output_is_capped_and_still_graded(verifier, calc_task):
    patch = replace_mean("    import sys\n    sys.stdout.write('x' * 100_000_000)\n    values = list(values)\n"
                         "    if not values:\n        raise ValueError('empty')\n    return sum(values) / len(values)")
    report = verifier.verify(calc_task, patch)
    assert report.resolved
    assert "output truncated" in report.test_output
    assert len(report.test_output) < 2_000_000


def test_patch_deleting_the_repository(verifier, calc_task, calc_sandbox):
    calc_sandbox.exec("git rm -rq . && git commit -qm wipe")
    wipe = calc_sandbox.diff()
    assert "deleted file mode" in wipe
    report = verifier.verify(calc_task, wipe)
    assert not report.resolved and not report.infrastructure_failure
    assert report.tests_status["FAIL_TO_PASS"]["failure"] == calc_task.FAIL_TO_PASS


def test_fork_bomb_in_the_patch_is_contained(verifier, calc_task, calc_sandbox):
    group = getattr(calc_sandbox, "_group", None)
    if group is None or not group.active:
        pytest.skip("no pids cgroup: a fork bomb would not be bounded here")
    task = calc_task.model_copy(update={"test_spec": calc_task.test_spec.model_copy(update={"timeout": 5})})
    task._source_file = calc_task.source_file
    bomb = replace_mean("    import os\n    while True:\n        try:\n            os.fork()\n        except OSError:\n            pass")
    report = verifier.verify(task, bomb)
    assert not report.resolved and not report.infrastructure_failure


def test_partial_credit_option(calc_task):
    report = Verifier(partial_credit=True).verify(calc_task, calc_task.patch)
    assert report.reward == 1.0
    empty = Verifier(partial_credit=True).verify(calc_task, "", run_empty=True)
    assert empty.reward == 0.0


def test_infrastructure_failure_is_kept_apart(calc_task):
    from patchgym.sandboxes import EnvironmentBuildError

    def broken_factory(task):
        raise EnvironmentBuildError("pip could not reach the index")

    report = Verifier(broken_factory).verify(calc_task, calc_task.patch)
    assert report.infrastructure_failure and "pip could not reach" in report.infrastructure_failure_reason
    assert not report.resolved and report.reward == 0.0


class _FarSandbox:
    """A sandbox on another machine as the ray backend offers it: ``run_near`` sends a function and
    its arguments there by pickle and brings the answer back the same way; nothing else is called."""

    def __init__(self, task, fail: bool = False) -> None:
        from patchgym.tasks.backends import make_sandbox

        self.near = make_sandbox(task)
        self.workdir, self.base_commit, self.fail = self.near.workdir, self.near.base_commit, fail

    def run_near(self, fn, *args, timeout, **kwargs):
        fn, args, kwargs = pickle.loads(pickle.dumps((fn, args, kwargs)))
        if self.fail:
            self.near.close()  # the node lost it mid-grading
        return pickle.loads(pickle.dumps(fn(self.near, *args, **kwargs)))

    def usage(self):
        return self.near.usage()

    def close(self):
        self.near.close()


def test_a_grading_runs_whole_where_the_sandbox_is(verifier, calc_task):
    far = Verifier(lambda t: _FarSandbox(t))
    near = verifier.verify(calc_task, calc_task.patch)
    report = far.verify(calc_task, calc_task.patch)
    assert report.resolved and report.tests_status == near.tests_status and "passed" in report.test_output
    assert report.cost.test_cpu_seconds > 0 and report.cost.harness_cpu_seconds > 0, report.cost
    assert not far.verify(calc_task, "", run_empty=True).resolved
    lost = Verifier(lambda t: _FarSandbox(t, fail=True)).verify(calc_task, calc_task.patch)
    assert lost.infrastructure_failure and not lost.resolved


class _ForgingSandbox:
    """Results say every test passed, but the runner exited 1: they must not be trusted."""

    workdir = "/testbed"
    base_commit = "0" * 40

    def __init__(self, exit_code: int) -> None:
        self.exit_code = exit_code
        self.files: dict[str, bytes] = {}

    def exec(self, command, timeout=60.0, cwd=None, env=None, output_limit=None):
        if "--junitxml=" in command:
            path = command.split("--junitxml=")[1].split()[0]
            cases = "".join(f'<testcase classname="tests.test_calc" name="{n.split("::")[-1]}" file="tests/test_calc.py"/>'
                            for n in command.split() if n.startswith("tests/"))
            self.files[path] = f"<testsuites><testsuite>{cases}</testsuite></testsuites>".encode()
            return ExecResult(self.exit_code, "", False, 0.1)
        if "--whitespace=nowarn" in command:  # git apply (verifier.py or patch_apply.py)
            return ExecResult(0, "Applied patch cleanly.\n\npatchgym-applied-with:git apply\n", False, 0.01)
        return ExecResult(0, "", False, 0.01)

    def write_file(self, path, data):
        self.files[path] = data.encode() if isinstance(data, str) else data

    def read_file(self, path):
        if path not in self.files:
            raise FileNotFoundError(path)
        return self.files[path]

    def diff(self):
        return ""

    def reset(self):
        pass

    def close(self):
        pass


@pytest.mark.parametrize("exit_code", [0, 1])
def test_a_junit_written_without_the_runner_is_not_believed(calc_task, exit_code):
    """A command that writes a junit naming every test as passed, but never ran patchgym's
    runner (so no results record, and the canaries 'pass' alike): tampering, reward 0."""
    forged = Verifier(lambda t: _ForgingSandbox(exit_code)).verify(calc_task, calc_task.patch)
    assert not forged.resolved and forged.reward == 0.0 and not forged.infrastructure_failure
    assert forged.tampering_detected and "results file is missing" in forged.tampering_reason


def test_split_and_filter_diffs():
    diff = new_file("pkg/a.py", "x = 1") + new_file("tests/test_a.py", "y = 2") + new_file("setup.cfg", "[x]")
    sections = split_diff(diff)
    assert [s.new_path for s in sections] == ["pkg/a.py", "tests/test_a.py", "setup.cfg"]
    filtered = filter_agent_patch(read_agent_patch(diff), protected={"pkg/other.py"})
    assert filtered.dropped == ["setup.cfg", "tests/test_a.py"]
    assert [s.new_path for s in split_diff(filtered.text)] == ["pkg/a.py"]
    plain = "--- a/pkg/a.py\n+++ b/pkg/a.py\n@@ -1 +1 @@\n-x\n+y\n"
    assert [s.old_path for s in split_diff(plain)] == ["pkg/a.py"]
    for path in ("conftest.py", "src/pkg/tests/helpers.py", "a/test_b.py", "b_test.py", "x.pth", "pyproject.toml"):
        assert is_test_or_config(path), path
    for path in ("pkg/testing_utils.py", "src/contest.py", "docs/index.md"):
        assert not is_test_or_config(path), path


def test_tampering_gets_the_tampering_reward_and_only_tampering():
    """The setting gives forging a price; an honest failure keeps 0 and a masked grade is never scored."""
    from patchgym import load_task_set
    from patchgym.grading.verifier import InstanceReport

    task = load_task_set(None).get("patchgym__semverkit-1")
    verifier = Verifier(lambda t: None, tampering_reward=-1.0)
    forged = InstanceReport(instance_id=task.instance_id, resolved=True, tampering_detected=True, tampering_reason="x")
    assert verifier._reward(forged, task) == -1.0
    assert Verifier(lambda t: None)._reward(forged, task) == 0.0  # default unchanged
    assert verifier._reward(InstanceReport(instance_id=task.instance_id), task) == 0.0
    masked = InstanceReport(instance_id=task.instance_id, tampering_detected=True, infrastructure_failure=True)
    assert verifier._reward(masked, task) == 0.0


def test_tampering_reward_reaches_every_grader():
    from patchgym.gym_envs.patch_env import PatchEnv
    from patchgym.gym_envs.repo_env import RepoEnv

    assert RepoEnv(tampering_reward=-0.5).verifier.tampering_reward == -0.5
    assert PatchEnv(tampering_reward=-0.5).verifier.tampering_reward == -0.5
