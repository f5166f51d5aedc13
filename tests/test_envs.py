"""The Gymnasium environments: API conformance, tool calls, episodes, truncation, vector envs."""

from __future__ import annotations

import json
import shlex

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import patchgym.gym_envs  # noqa: F401  (registers the environments)
from patchgym.gym_envs import RepoEnv, TrajectoryRecorder


def bash(command: str) -> dict:
    return {"name": "bash", "arguments": {"command": command}}


def apply_via_bash(patch: str) -> dict:
    return bash(f"printf %s {shlex.quote(patch)} > /tmp/fix.diff && git apply /tmp/fix.diff")


@pytest.fixture
def env(calc_tasks_file):
    e = gym.make("patchgym/RepoEnv-v0", tasks=str(calc_tasks_file), max_steps=10)
    yield e
    e.close()


def test_both_environments_pass_gymnasiums_checker(calc_tasks_file):
    for env_id in ("patchgym/RepoEnv-v0", "patchgym/PatchEnv-v0"):
        env = gym.make(env_id, tasks=str(calc_tasks_file))
        check_env(env.unwrapped)
        env.close()
        env.close()


def test_text_spaces_accept_real_output():
    env = RepoEnv.__new__(RepoEnv)
    RepoEnv.__init__(env, tasks=None)
    for text in ("", "naïve 日本語 → ✓\x00\x1b[31m", "x" * 100_000):
        assert env.observation_space.contains(text)
    assert not env.observation_space.contains(b"bytes")
    env.close()


def test_the_action_space_holds_the_tool_calls_step_carries_out():
    """Every form ``step`` runs is in the space, what it refuses as an invalid action is not, and
    samples are tool calls of every tool that the space holds."""
    space = RepoEnv(tasks=None).action_space
    inside = [{"name": "submit", "arguments": {}}, {"name": "submit"}, bash("ls"),
              json.dumps(bash("ls")), {"name": "bash", "arguments": json.dumps({"command": "ls"})},
              {"type": "function", "function": {"name": "bash", "arguments": '{"command": "pwd"}'}},
              {"name": "str_replace_editor", "arguments": {"command": "view", "path": "/testbed/x.py",
                                                           "view_range": [1, -1]}},
              {"name": "str_replace_editor", "arguments": {"command": "insert", "path": "x", "insert_line": 0,
                                                           "new_str": "a"}}]
    outside = ["ls", "", "x" * 100_000, 7, None, {"arguments": {}}, {"name": "python", "arguments": {}},
               {"name": "bash", "arguments": {}}, {"name": "bash", "arguments": {"command": 3}},
               {"name": "bash", "arguments": {"command": "ls", "cwd": "/"}}, {"name": "bash", "arguments": "{no"},
               {"name": "str_replace_editor", "arguments": {"command": "delete", "path": "x"}},
               {"name": "str_replace_editor", "arguments": {"command": "insert", "path": "x", "insert_line": True}},
               {"name": "str_replace_editor", "arguments": {"command": "view", "path": "x", "view_range": ["1"]}},
               bash("x" * 2_000_000)]
    assert [a for a in inside if not space.contains(a)] == []
    assert [a for a in outside if space.contains(a)] == []
    space.seed(3)
    samples = [space.sample() for _ in range(60)]
    assert all(space.contains(a) for a in samples)
    assert {a["name"] for a in samples} == {"bash", "str_replace_editor", "submit"}
    assert repr(space) == "ToolCalls(bash, str_replace_editor, submit)"


def test_sampled_actions_run(env):
    """A random policy's actions are carried out, not refused."""
    env.reset(options={"task_id": "fixture__calc-1"})
    space = env.action_space
    space.seed(0)
    for action in [a for a in (space.sample() for _ in range(30)) if a["name"] != "submit"][:4]:
        obs, reward, terminated, truncated, info = env.step(action)
        assert not info["invalid_action"], (action, obs)


def test_reset_observation_info_and_seeded_choice(env, calc_task):
    obs, info = env.reset(options={"task_id": "fixture__calc-1"})
    assert calc_task.problem_statement in obs and "/testbed" in obs or info["workdir"] in obs
    assert "test_mean_empty" not in obs and "diff --git" not in obs
    assert info["instance_id"] == "fixture__calc-1" and info["max_steps"] == 10
    assert not info["infrastructure_failure"]
    first, _ = env.reset(seed=7)
    second, _ = env.reset(seed=7)
    assert first == second
    with pytest.raises(KeyError, match="unknown instance id 'nope'"):
        env.reset(options={"task_id": "nope"})


def test_tools_are_openai_schemas(env):
    tools = env.unwrapped.tools
    assert [t["function"]["name"] for t in tools] == ["bash", "str_replace_editor", "submit"]
    for tool in tools:
        assert tool["type"] == "function" and tool["function"]["parameters"]["type"] == "object"
    tools[0]["function"]["name"] = "mutated"
    assert env.unwrapped.tools[0]["function"]["name"] == "bash"


def test_bash_steps_in_every_accepted_form(env):
    env.reset(options={"task_id": "fixture__calc-1"})
    obs, reward, term, trunc, info = env.step(bash("echo hi; exit 4"))
    assert obs == "hi\n[exit code: 4]" and info["exit_code"] == 4 and reward == 0.0 and not (term or trunc)
    obs, *_ = env.step(json.dumps({"name": "bash", "arguments": json.dumps({"command": "printf ''"})}))
    assert obs == "[exit code: 0]"
    obs, *_ = env.step({"type": "function", "function": {"name": "bash", "arguments": '{"command": "pwd"}'}})
    assert obs.startswith(env.unwrapped.sandbox.workdir)


def test_bash_output_is_truncated_and_timeouts_keep_partial_output(calc_tasks_file):
    env = gym.make("patchgym/RepoEnv-v0", tasks=str(calc_tasks_file), output_limit=2000, command_timeout=2)
    try:
        env.reset()
        obs, *_ = env.step(bash("seq 1 100000"))
        assert obs.startswith("1\n2\n") and "output truncated" in obs and obs.rstrip().endswith("[exit code: 0]")
        assert len(obs) < 2500
        obs, _, term, _, info = env.step(bash("echo before; sleep 30"))
        assert "before" in obs and "timed out" in obs and not term
    finally:
        env.close()


@pytest.mark.parametrize(
    ("action", "message"),
    [
        ("{not json", "not valid JSON"),
        ('"just a string"', "must be an object"),
        ({"arguments": {}}, "no tool 'name'"),
        ({"name": "rm_rf", "arguments": {}}, "unknown tool 'rm_rf'"),
        ({"name": "bash", "arguments": "{oops"}, "arguments of 'bash' are not valid JSON"),
        ({"name": "bash", "arguments": {}}, "needs a non-empty string argument 'command'"),
        ({"name": "bash", "arguments": {"command": "ls", "sudo": True}}, "unexpected arguments: sudo"),
        ({"name": "str_replace_editor", "arguments": {"command": "view", "path": "/etc/passwd"}}, "outside"),
    ],
)
def test_invalid_actions_explain_and_continue(env, action, message):
    env.reset()
    obs, reward, term, trunc, info = env.step(action)
    assert info["invalid_action"] and message in info["error"] and message in obs
    assert reward == 0.0 and not term and not trunc
    obs, *_ = env.step(bash("echo still-here"))
    assert obs.startswith("still-here")


def test_immediate_submit_is_not_rewarded(env):
    env.reset()
    obs, reward, term, trunc, info = env.step({"name": "submit", "arguments": {}})
    assert term and not trunc and reward == 0.0 and info["elapsed"] > 0 and "_started" not in info
    assert info["resolved"] is False and info["report"]["patch_exists"] is False
    assert not info["infrastructure_failure"]
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(bash("true"))


def test_a_real_fix_is_rewarded_on_the_terminal_step_only(env, calc_task):
    env.reset()
    obs, reward, term, _, info = env.step(apply_via_bash(calc_task.patch))
    assert info["exit_code"] == 0 and reward == 0.0 and not term
    obs, reward, term, trunc, info = env.step({"name": "submit", "arguments": {}})
    assert term and reward == 1.0 and info["resolved"]
    assert "+        raise ValueError" in info["patch"]
    assert info["report"]["tests_status"]["FAIL_TO_PASS"]["success"] == ["tests/test_calc.py::test_mean_empty"]


def test_max_steps_truncates_and_grades(calc_tasks_file, calc_task):
    env = gym.make("patchgym/RepoEnv-v0", tasks=str(calc_tasks_file), max_steps=2)
    try:
        env.reset()
        _, _, term, trunc, _ = env.step(apply_via_bash(calc_task.patch))
        assert not term and not trunc
        _, reward, term, trunc, info = env.step(bash("true"))
        assert trunc and not term and reward == 1.0 and info["resolved"]
    finally:
        env.close()
    env = gym.make("patchgym/RepoEnv-v0", tasks=str(calc_tasks_file), max_steps=1, grade_on_truncation=False)
    try:
        env.reset()
        _, reward, term, trunc, info = env.step(apply_via_bash(calc_task.patch))
        assert trunc and reward == 0.0 and "report" not in info
    finally:
        env.close()


def test_wall_clock_budget_truncates(calc_tasks_file):
    env = gym.make("patchgym/RepoEnv-v0", tasks=str(calc_tasks_file), time_limit=0.5, grade_on_truncation=False)
    try:
        env.reset()
        _, _, _, trunc, _ = env.step(bash("sleep 1"))
        assert trunc
    finally:
        env.close()


def test_partial_credit(calc_tasks_file, calc_task):
    env = gym.make("patchgym/RepoEnv-v0", tasks=str(calc_tasks_file), partial_credit=True)
    try:
        env.reset()
        env.step(apply_via_bash(calc_task.patch))
        assert env.step({"name": "submit", "arguments": {}})[1] == 1.0
    finally:
        env.close()


def test_infrastructure_failure_is_flagged_not_scored(calc_repo, tmp_path):
    from conftest import calc_task_row

    repo, info = calc_repo
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(calc_task_row(repo, info, environment={"python": "==2.5"})) + "\n")
    env = gym.make("patchgym/RepoEnv-v0", tasks=str(path))
    try:
        obs, info = env.reset()
        assert info["infrastructure_failure"] and "could not be started" in obs
        _, reward, term, _, info = env.step(bash("ls"))
        assert term and reward == 0.0 and info["infrastructure_failure"]
        assert "no Python interpreter" in info["infrastructure_failure_reason"]
    finally:
        env.close()


def test_close_is_idempotent_and_frees_the_sandbox(env):
    env.reset()
    root = env.unwrapped.sandbox.root
    assert root.exists()
    env.close()
    env.close()
    assert not root.exists()


def test_patch_env(calc_tasks_file, calc_task):
    env = gym.make("patchgym/PatchEnv-v0", tasks=str(calc_tasks_file))
    try:
        obs, info = env.reset()
        assert "unified diff" in obs and info["instance_id"] == "fixture__calc-1"
        obs, reward, term, trunc, info = env.step(calc_task.patch)
        assert (reward, term, trunc) == (1.0, True, False) and info["resolved"]
        env.reset()
        obs, reward, _, _, info = env.step("not a diff at all")
        assert reward == 0.0 and info["invalid_action"] and "not applied" in obs
        env.reset()
        _, reward, _, _, info = env.step(json.dumps({"name": "submit", "arguments": {"patch": calc_task.patch}}))
        assert reward == 1.0
        env.reset()
        _, reward, _, _, info = env.step("")
        assert reward == 0.0 and not info["resolved"]
    finally:
        env.close()


def test_async_vector_env(calc_tasks_file, calc_task):
    envs = gym.vector.AsyncVectorEnv(
        [lambda: gym.make("patchgym/RepoEnv-v0", tasks=str(calc_tasks_file), max_steps=5)] * 2,
        shared_memory=False)  # text cannot live in Gymnasium's shared memory
    try:
        obs, infos = envs.reset(seed=[1, 2])
        assert len(obs) == 2 and all("mean" in o for o in obs)
        obs, rewards, terms, truncs, infos = envs.step([apply_via_bash(calc_task.patch), bash("echo x")])
        assert list(rewards) == [0.0, 0.0]
        obs, rewards, terms, truncs, infos = envs.step([{"name": "submit", "arguments": {}}] * 2)
        assert list(rewards) == [1.0, 0.0] and list(terms) == [True, True]
    finally:
        envs.close()


def test_trajectory_recorder_writes_one_line_per_episode(calc_tasks_file, calc_task, tmp_path):
    path = tmp_path / "traj" / "episodes.jsonl"
    env = TrajectoryRecorder(gym.make("patchgym/RepoEnv-v0", tasks=str(calc_tasks_file)), path,
                             metadata={"model": "oracle"})
    env.reset(seed=3)
    env.step(apply_via_bash(calc_task.patch))
    env.step({"name": "submit", "arguments": {}})
    env.reset(seed=4)
    env.step(bash("echo unfinished"))
    env.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 2
    done, cut = lines
    assert done["finished"] and done["reward"] == 1.0 and done["resolved"] and done["metadata"] == {"model": "oracle"}
    assert [s["info"]["tool"] for s in done["steps"]] == ["bash", "submit"]
    assert done["report"]["resolved"] and "diff --git" in done["patch"]
    assert calc_task.problem_statement in done["observation"]
    assert all(s["seconds"] >= 0 for s in done["steps"])
    assert not cut["finished"] and cut["steps"][0]["observation"].startswith("unfinished")
