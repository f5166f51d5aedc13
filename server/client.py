"""``RemoteEnv``: the ``RepoEnv`` API over HTTP, for trainers that run apart from the sandboxes.

    import gymnasium as gym
    import patchgym.server  # registers patchgym/Remote-v0

    env = gym.make("patchgym/Remote-v0", url="http://127.0.0.1:8000", token=None)
    obs, info = env.reset(options={"task_id": "patchgym__semverkit-1"})
    obs, reward, terminated, truncated, info = env.step({"name": "submit", "arguments": {}})
    env.close()  # deletes the server-side session
"""

from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym
import httpx

from patchgym.gym_envs.common import MAX_ACTION_CHARS, MAX_OBSERVATION_CHARS
from patchgym.gym_envs.spaces import UnicodeText


class RemoteEnvError(RuntimeError):
    """The server refused or failed a request."""

    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(f"HTTP {status_code}: {detail}")
        self.status_code = status_code
        self.detail = detail


class RemoteEnv(gym.Env[str, Any]):
    """A ``RepoEnv`` held by a patchgym server: same spaces, actions, observations and info.

    Args:
        url: the server, e.g. ``http://127.0.0.1:8000``.
        token: bearer token, when the server requires one.
        max_steps, time_limit: per-session episode limits (default: the server's).
        timeout: seconds one request may take (a reset may build an environment; a submit runs
            the hidden tests, so this is generous); ``connect_timeout`` for connecting.
    """

    metadata = {"render_modes": []}

    def __init__(self, url: str, token: str | None = None, *, max_steps: int | None = None,
                 time_limit: float | None = None, timeout: float = 1800.0, connect_timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.max_steps = max_steps
        self.time_limit = time_limit
        self.observation_space = UnicodeText(MAX_OBSERVATION_CHARS)
        self.action_space = UnicodeText(MAX_ACTION_CHARS)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.url, headers=headers,
                                  timeout=httpx.Timeout(timeout, connect=connect_timeout))
        self.session_id: str | None = None
        self._tools: list[dict[str, Any]] | None = None
        self._closed = False

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The OpenAI tool schemas to hand to a model (known after the first reset)."""
        if self._tools is None:
            raise RuntimeError("the tools are known once the session exists: call reset() first")
        return copy.deepcopy(self._tools)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        if self._closed:
            raise RuntimeError("the environment is closed")
        task_id = (options or {}).get("task_id")
        task_id = None if task_id is None else str(task_id)
        if self.session_id is not None:
            try:
                body = self._call("POST", f"/v1/sessions/{self.session_id}/reset", {"task_id": task_id, "seed": seed})
                return body["observation"], body["info"]
            except RemoteEnvError as exc:
                if exc.status_code != 404 or "session" not in exc.detail:
                    raise
                self.session_id = None  # reaped or closed by the server: open a new one
        body = self._call("POST", "/v1/sessions", {"task_id": task_id, "seed": seed, "max_steps": self.max_steps,
                                                    "time_limit": self.time_limit})
        self.session_id = body["session_id"]
        self._tools = body["tools"]
        return body["observation"], body["info"]

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.session_id is None:
            raise RuntimeError("the episode is over (or was never started): call reset()")
        if not isinstance(action, (dict, str)):
            action = str(action)  # the server explains what a tool call looks like
        body = self._call("POST", f"/v1/sessions/{self.session_id}/step", {"action": action})
        return body["observation"], float(body["reward"]), body["terminated"], body["truncated"], body["info"]

    def close(self) -> None:
        """Delete the server-side session and close the connection. Idempotent."""
        if self._closed:
            return
        self._closed = True
        session_id, self.session_id = self.session_id, None
        try:
            if session_id is not None:
                try:
                    self._call("DELETE", f"/v1/sessions/{session_id}")
                except (RemoteEnvError, httpx.HTTPError):
                    pass  # already gone, or the server is: the idle reaper frees it
        finally:
            self._http.close()

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        if body is not None:
            body = {k: v for k, v in body.items() if v is not None}
        response = self._http.request(method, path, json=body)
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            raise RemoteEnvError(response.status_code, detail if isinstance(detail, str) else str(detail))
        return response.json() if response.content else None
