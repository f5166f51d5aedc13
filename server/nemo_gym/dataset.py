"""Tasks as NeMo Gym dataset rows: the prompt and tools a model sees, and the task id
``/seed_session`` opens; never the answers."""

from collections.abc import Iterator
from typing import Any

from patchgym.gym_envs.common import task_briefing
from patchgym.gym_envs.repo_env import RepoEnv
from patchgym.tasks.catalog import TaskSet

SYSTEM_PROMPT = (
    "You are fixing a bug in a software repository. Use the tools to explore the code, edit it and run "
    "its tests; call submit when the fix is done. Hidden tests will grade the fix."
)
WORKDIR_NOTE = "the tools' working directory (bash starts there)"


def responses_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat Completions tool schemas in the Responses API's flat form, which NeMo Gym rows use."""
    flat = []
    for tool in tools:
        spec = tool.get("function", tool)
        flat.append({"type": "function", "name": spec["name"], "description": spec.get("description", ""),
                     "parameters": spec.get("parameters", {"type": "object", "properties": {}}), "strict": False})
    return flat


def nemo_gym_dataset_rows(task_set: TaskSet, *, agent_name: str | None = None) -> Iterator[dict[str, Any]]:
    """One NeMo Gym dataset row per task: the prompt RepoEnv's first observation gives (minus the
    sandbox path, unknown before a sandbox exists), the tools, and ``instance_id``, which
    /seed_session opens. Never the gold patch or the tests: a row is what the model sees.
    ``agent_name`` adds the ``agent_ref`` NeMo Gym's rollout collection routes rows by."""
    tools = responses_tools(RepoEnv(task_set).tools)
    for task in task_set:
        row: dict[str, Any] = {
            "responses_create_params": {
                "input": [{"role": "system", "content": SYSTEM_PROMPT},
                          {"role": "user", "content": task_briefing(task, WORKDIR_NOTE)}],
                "tools": tools,
            },
            "instance_id": task.instance_id,
        }
        if agent_name:
            row["agent_ref"] = {"type": "responses_api_agents", "name": agent_name}
        yield row
