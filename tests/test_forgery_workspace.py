"""A RepoEnv workspace the harness cannot diff ends the episode as the agent's failure (issue 21).

Attacks written before the defense: on the local backend a path longer than PATH_MAX made
``env.step(submit)`` raise ``OSError`` to the caller, and on Docker the episode was masked as an
infrastructure failure. Each must end the episode from ``step()`` with reward 0, ``resolved: false``,
not masked, and the reason in the report's ``error``.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import gymnasium as gym
import pytest

from patchgym import load_task_set
from patchgym.sandboxes import SandboxError, WorkspaceError, gitops
from patchgym.sandboxes.gitops import Pristine
from patchgym.tasks.catalog import TaskSet
from patchgym.tasks.model import Task
from tests.test_reward_forgery import SUBMIT, Error, _git, assert_refused, episode_report, play

TASK_ID = "patchgym__semverkit-1"
# 20 nested directories of 250 characters: a path of over 5,000 bytes (PATH_MAX is 4,096), made
# one directory at a time with relative names, as nothing refuses.
DEEP = ('d=$(printf "%0250d" 0); for i in $(seq 20); do mkdir "$d" && cd "$d" || exit 1; done; '
        'echo "x = 1" > deep.py; ln -s deep.py link.py; echo made')

EPISODES = {
    "a path longer than PATH_MAX": [DEEP],
    "a path longer than PATH_MAX beside the gold fix": ["printf %s \"$GOLD\" | git apply", DEEP],
}


@pytest.fixture(scope="module")
def task() -> Task:
    return load_task_set(None).get(TASK_ID)


@pytest.mark.parametrize("name", list(EPISODES))
def test_an_undiffable_workspace_is_the_agents_failure(name, task, backend):
    commands = [c.replace('"$GOLD"', shlex.quote(task.patch)) for c in EPISODES[name]]
    reward, info = play(task, backend, commands)
    assert_refused(episode_report(reward, info), task, Error("the workspace cannot be diffed"))
    assert "cannot be diffed" in info["report"]["error"], info["report"]["error"]


def test_any_error_reading_the_workspace_ends_the_episode_unmasked(task):
    """Whatever else the tree makes the harness's diff raise (not a SandboxError) is the agent's
    failure from ``step()``, never an exception out of it."""
    env = gym.make("patchgym/RepoEnv-v0", tasks=TaskSet([task]), backend="local", max_steps=3)
    try:
        env.reset(options={"task_id": task.instance_id})

        def broken() -> str:
            raise OSError(36, "File name too long")

        env.unwrapped.sandbox.diff = broken
        _, reward, terminated, _, info = env.step(SUBMIT)
    finally:
        env.close()
    assert terminated and reward == 0.0 and info["infrastructure_failure"] is False
    assert info["report"]["error"] == "the workspace cannot be diffed: OSError: [Errno 36] File name too long"


def _committed_repo(root: Path) -> Pristine:
    root.mkdir()
    _git(root, "init", "-q")
    (root / "a.py").write_text("a = 1\n")
    _git(root, "add", "a.py")
    _git(root, "commit", "-qm", "base")
    pristine = Pristine.load(root / ".git")
    pristine.snapshot(root)
    return pristine


def test_git_failing_on_the_workspace_blames_the_workspace_only_if_git_works_on_the_base(tmp_path, monkeypatch):
    pristine = _committed_repo(tmp_path / "repo")
    (tmp_path / "repo" / "new.py").write_text("b = 2\n")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    assert "+b = 2" in gitops.workspace_diff(tmp_path / "repo", pristine, scratch)

    def choke(*args, **kwargs):
        raise gitops.GitFailed("git check-ignore failed: fatal: something in the tree")

    monkeypatch.setattr(gitops, "_not_ignored", choke)
    with pytest.raises(WorkspaceError, match="git cannot diff the workspace: git check-ignore failed"):
        gitops.workspace_diff(tmp_path / "repo", pristine, scratch)
    monkeypatch.setattr(gitops, "_git_sound", lambda *args: False)  # git is broken whatever the tree
    with pytest.raises(SandboxError) as raised:
        gitops.workspace_diff(tmp_path / "repo", pristine, scratch)
    assert not isinstance(raised.value, WorkspaceError)
    assert list(scratch.iterdir()) == []


def test_a_long_path_is_refused_before_anything_reads_it(tmp_path):
    pristine = _committed_repo(tmp_path / "repo")
    deep = tmp_path / "repo" / "d" / ("x" * 250) / ("y" * 250) / ("z" * 250) / ("w" * 250)
    names = [("n" * 250) for _ in range(5)]
    deep.mkdir(parents=True)
    target = deep
    for name in names:  # past 2,048 bytes relative, under PATH_MAX absolute
        target = target / name
        if len(os.fsencode(target)) > 4000:
            break
        target.mkdir()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with pytest.raises(WorkspaceError, match=f"a path longer than {gitops.MAX_PATH_BYTES} bytes"):
        gitops.workspace_diff(tmp_path / "repo", pristine, scratch)
