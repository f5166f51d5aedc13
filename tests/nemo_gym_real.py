"""Run the real NeMo Gym (its launcher, ``gym env start``, and ``gym eval run --no-serve``) against
``patchgym serve``, for each release in :mod:`tests.nemo_gym_root` (which builds the Debian roots
they run in: 0.4.0 on trixie's Python 3.13.5, 0.7.0 on forky's python3.13).

The commands are the ones ``patchgym nemo-gym init`` prints and docs/nemo_gym.md gives, the same
for both releases (0.4.0 prints that its older ``ng_run`` is deprecated in their favour); a run adds
``+uv_venv_dir=/opt/ng-venvs +skip_venv_if_present=true`` so the launcher uses the pre-built venvs
and installs nothing. 0.7.0 puts its environment server (``single_agent_turn_legacy``, from the
config init writes) in front of ``simple_agent``: typed seed, the agent's turn, verify, close.

Everything of a run lives in a network namespace that has only ``lo`` (Ray and NeMo Gym's servers
listen on every interface): ``patchgym serve`` and the scripted model server (host Python), the
launcher and all it starts, and each collection (in the root, through ``chroot``). Each chrooted
command runs in its own private mount namespace (``unshare --mount``) where ``/proc``, ``/dev``,
``/sys`` and a per-run host directory on ``/tmp`` are mounted, so nothing stays mounted when it
exits, whatever happens. At the end every process in the namespace is killed (Ray daemons
included), the namespace is deleted and the run directory removed.

The model is a scripted OpenAI Responses endpoint (``POST /v1/responses``, what NeMo Gym's
``openai_model`` calls): each rollout's user message carries a marker ``[pg-script:NAME]`` and the
server replays that script, one tool call per turn (the turn is the number of ``function_call``
items already in the input), then answers a plain assistant message, which ends ``simple_agent``'s
loop.

The NeMo Gym directory is what ``patchgym nemo-gym init DIR --external`` writes (the same shape is
written here when the tree lacks that command). Environment:

``PATCHGYM_NEMO_GYM_CACHE``  where roots are kept (default ``cache_dir("nemo-gym")`` of the
                             ``PATCHGYM_HOME`` the process started with, not the tests' temp home)
``PATCHGYM_NEMO_GYM_HOME``   the ``PATCHGYM_HOME`` of the patchgym side (task venvs, checkouts);
                             default: the one the process started with
``PATCHGYM_NEMO_GYM_TREE``   the patchgym source tree to run (e.g. ``git archive`` of an older
                             commit unpacked somewhere); default: this one
``PATCHGYM_NEMO_GYM_KEEP``   copy the run directory (logs, NeMo Gym's files) there at the end

Command line (used by the tests and ``bench/nemo_gym_rollouts.py``)::

    python -m tests.nemo_gym_real model --port P --scripts FILE --ready FILE   # the scripted model
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.nemo_gym_root import (
    _IMPORT_HOME,
    NEMO_GYM_04,
    NEMO_VENV,
    RESOURCES_DIR,
    RESOURCES_REQUIREMENTS,
    RUN_TMP,
    SERVER_VENVS,
    Release,
    chroot_argv,
    ensure_root,
    missing_requirements,
)
from tests.netns import Netns

REPO_ROOT = Path(__file__).resolve().parent.parent
WORK = f"{RUN_TMP}/work"  # where the launcher and collections run (holds resources_servers/patchgym)
AGENT_NAME = "patchgym_agent"
RESOURCES_NAME = "patchgym_resources_server"
MODEL_NAME = "policy_model"
MARKER = "[pg-script:{}]"
DEFAULT_TASKS = REPO_ROOT / "tasks" / "instances" / "dotenvkit.jsonl"
DEFAULT_INSTANCE = "patchgym__dotenvkit-1"
# The fixed ports inside the namespace (a fresh namespace: all free; outside the launcher's 10001-20000)
PATCHGYM_PORT = 21000
MODEL_PORT = 21001
__all__ = ["missing_requirements"]  # re-exported for the tests' skip conditions

Progress = Callable[[str], None] | None


def _say(progress: Progress, message: str) -> None:
    if progress is not None:
        progress(message)


# --------------------------------------------------------------------------------------------------
# the scripted model (an OpenAI Responses endpoint)


def _text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


class ScriptedModel:
    """Replays ``scripts[name]`` (a list of ``{"name", "arguments"}`` tool calls) for each request
    whose input carries ``[pg-script:name]``."""

    def __init__(self, scripts: dict[str, list[dict]]) -> None:
        self.scripts = scripts
        self.lock = threading.Lock()
        self.requests = 0

    def respond(self, body: dict) -> dict:
        with self.lock:
            self.requests += 1
        items = body.get("input") or []
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
        text = " ".join(_text(i.get("content")) for i in items if isinstance(i, dict) and i.get("role") == "user")
        name = next((n for n in self.scripts if MARKER.format(n) in text), None)
        turn = sum(1 for i in items if isinstance(i, dict) and i.get("type") == "function_call")
        rid = uuid.uuid4().hex
        if name is not None and turn < len(self.scripts[name]):
            call = self.scripts[name][turn]
            output = [{"type": "function_call", "id": f"fc_{rid}", "call_id": f"call_{rid}", "status": "completed",
                       "name": call["name"], "arguments": json.dumps(call.get("arguments", {}))}]
        else:
            said = "Done." if name is not None else "No script for this prompt."
            output = [{"type": "message", "id": f"msg_{rid}", "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": said, "annotations": []}]}]
        return {"id": f"resp_{rid}", "object": "response", "created_at": int(time.time()),
                "model": body.get("model") or "scripted", "status": "completed", "output": output,
                "parallel_tool_calls": False, "tool_choice": body.get("tool_choice") or "auto",
                "tools": body.get("tools") or [],
                "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2,
                          "input_tokens_details": {"cached_tokens": 0},
                          "output_tokens_details": {"reasoning_tokens": 0}}}


def serve_model(port: int, scripts: dict[str, list[dict]], ready: Path | None = None) -> None:
    model = ScriptedModel(scripts)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            if self.path.rstrip("/").endswith("/models"):
                self._send(200, {"object": "list", "data": [{"id": "scripted", "object": "model"}]})
            else:
                self._send(200, {"requests": model.requests})

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path.rstrip("/").endswith("/responses"):
                self._send(200, model.respond(body))
            else:
                self._send(404, {"error": {"message": f"the scripted model serves only /v1/responses, not {self.path}"}})

        def log_message(self, fmt: str, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    if ready is not None:
        ready.write_text(str(port))
    server.serve_forever()


# --------------------------------------------------------------------------------------------------
# scripts, rows and the NeMo Gym directory


def gold_patch(tasks: Path, instance_id: str) -> str:
    from patchgym import load_tasks

    task = next(t for t in load_tasks(tasks) if t.instance_id == instance_id)
    return task.patch


def oracle_calls(patch: str) -> list[dict]:
    """The gold patch applied through bash (a quoted heredoc into ``git apply``), then submit."""
    delimiter = "PG_GOLD_PATCH_EOF"
    assert delimiter not in patch
    body = patch if patch.endswith("\n") else patch + "\n"
    return [{"name": "bash", "arguments": {"command": f"git apply <<'{delimiter}'\n{body}{delimiter}\n"}},
            {"name": "bash", "arguments": {"command": "git diff --stat"}},
            {"name": "submit", "arguments": {}}]


def case_scripts(patch: str) -> dict[str, list[dict]]:
    oracle = oracle_calls(patch)
    return {
        "oracle": oracle,
        "noop": [{"name": "submit", "arguments": {}}],
        "unknown_then_oracle": [{"name": "no_such_tool", "arguments": {"x": 1}}, *oracle],
    }


def dataset_rows(tasks: Path, instance_id: str, markers: list[str], *, env: dict[str, str]) -> list[dict]:
    """``patchgym tasks nemo-gym-dataset`` rows, one per marker, the marker added to the user message."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.jsonl"
        subprocess.run([*_patchgym_cli(), "tasks", "nemo-gym-dataset", "--tasks", str(tasks),
                        "--instance-ids", instance_id, "--output", str(out), "--agent-name", AGENT_NAME],
                       check=True, capture_output=True, env=env, cwd=patchgym_tree())
        base = json.loads(out.read_text().splitlines()[0])
    rows = []
    for marker in markers:
        row = json.loads(json.dumps(base))
        user = next(m for m in row["responses_create_params"]["input"] if m.get("role") == "user")
        user["content"] = f"{user['content']}\n\n{MARKER.format(marker)}"
        rows.append(row)
    return rows


def patchgym_tree() -> Path:
    """The patchgym source tree whose CLI and server are run: ``$PATCHGYM_NEMO_GYM_TREE`` (e.g. a
    ``git worktree`` of an older commit, to see which cases it fails), else this one."""
    return Path(os.environ.get("PATCHGYM_NEMO_GYM_TREE") or REPO_ROOT).resolve()


def _patchgym_cli() -> list[str]:
    """The ``patchgym`` command of :func:`patchgym_tree` (its ``[project.scripts]`` entry point, run
    with this Python; the tree is first on ``PYTHONPATH``), whatever module it lives in."""
    import tomllib

    pyproject = tomllib.loads((patchgym_tree() / "pyproject.toml").read_text())
    module, _, func = pyproject["project"]["scripts"]["patchgym"].partition(":")
    code = f"import sys; from {module} import {func} as entry; sys.argv[0] = 'patchgym'; sys.exit(entry())"
    return [sys.executable, "-c", code]


def init_help(env: dict[str, str]) -> str | None:
    """``patchgym nemo-gym init --help`` of the tree (None when it has no such command)."""
    proc = subprocess.run([*_patchgym_cli(), "nemo-gym", "init", "--help"], capture_output=True, text=True, env=env,
                          cwd=patchgym_tree())
    return proc.stdout if proc.returncode == 0 else None


FALLBACK_APP = '''\
"""patchgym as an external NeMo Gym resources server: starts nothing; lives while the patchgym at
the configured host/port answers (ng_run calls that server directly, by host and port)."""
import sys
import time
import urllib.error
import urllib.request

URL = "http://{host}:{port}/healthz"


def answers() -> bool:
    try:
        urllib.request.urlopen(URL, timeout=5).read()
        return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


deadline = time.monotonic() + 300
while not answers():
    if time.monotonic() > deadline:
        sys.exit(f"patchgym does not answer at {{URL}}")
    time.sleep(1)
misses = 0
while misses < 3:
    time.sleep(2)
    misses = 0 if answers() else misses + 1
sys.exit(f"patchgym stopped answering at {{URL}}")
'''


def write_fallback_dir(work: Path, port: int, max_steps: int) -> None:
    """What ``patchgym nemo-gym init DIR --external`` writes, for a tree that lacks the command."""
    d = work / RESOURCES_DIR
    (d / "configs").mkdir(parents=True, exist_ok=True)
    (d / "data").mkdir(parents=True, exist_ok=True)
    (d / "app.py").write_text(FALLBACK_APP.format(host="127.0.0.1", port=port))
    (d / "requirements.txt").write_text(RESOURCES_REQUIREMENTS)
    (d / "configs" / "patchgym.yaml").write_text(textwrap.dedent(f"""\
        {RESOURCES_NAME}:
          resources_servers:
            patchgym:
              entrypoint: app.py
              domain: coding
              host: 127.0.0.1
              port: {port}
              external: true
        {AGENT_NAME}:
          responses_api_agents:
            simple_agent:
              entrypoint: app.py
              resources_server: {{type: resources_servers, name: {RESOURCES_NAME}}}
              model_server: {{type: responses_api_models, name: {MODEL_NAME}}}
              max_steps: {max_steps}
              datasets:
                - {{name: train, type: train, jsonl_fpath: {RESOURCES_DIR}/data/train.jsonl, num_repeats: 1, license: "TBD"}}
        """))


def write_nemo_dir(work: Path, tasks: Path, instance_id: str, port: int, *, env: dict[str, str],
                   release: Release = NEMO_GYM_04, max_steps: int = 30) -> str:
    """The NeMo Gym side of patchgym in ``work``, for ``release``; returns how it was made ("init" or
    "fallback"). A tree whose init has no ``--nemo-gym-version`` writes 0.4.0's config."""
    usage = init_help(env)
    if usage is not None:
        version = ["--nemo-gym-version", release.short] if "--nemo-gym-version" in usage else []
        subprocess.run([*_patchgym_cli(), "nemo-gym", "init", str(work), "--tasks", str(tasks), "--instance-ids",
                        instance_id, "--external", "--host", "127.0.0.1", "--port", str(port), *version],
                       check=True, capture_output=True, env=env, cwd=patchgym_tree())
        how = "init"
    else:
        write_fallback_dir(work, port, max_steps)
        how = "fallback"
    train = work / RESOURCES_DIR / "data" / "train.jsonl"
    if not train.exists():
        train.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([*_patchgym_cli(), "tasks", "nemo-gym-dataset", "--tasks", str(tasks), "--instance-ids",
                        instance_id, "--output", str(train), "--agent-name", AGENT_NAME],
                       check=True, capture_output=True, env=env, cwd=patchgym_tree())
    return how


MODEL_YAML = f"""\
{MODEL_NAME}:
  responses_api_models:
    openai_model:
      entrypoint: app.py
      openai_base_url: http://127.0.0.1:{MODEL_PORT}/v1
      openai_api_key: scripted
      openai_model: scripted
      openai_default_headers: {{}}
"""


# --------------------------------------------------------------------------------------------------
# a run


@dataclass
class Collection:
    """One ``ng_collect_rollouts`` run: the rows NeMo Gym wrote and how it went."""

    rows: list[dict]  # the rollouts JSONL (NeMo Gym writes successes there)
    failures: list[dict]  # its ``<stem>_failures.jsonl`` sidecar
    returncode: int  # -1: timed out
    log: str
    seconds: float
    metrics: object = None  # ``<stem>_aggregate_metrics.json``, when written

    def rewards(self) -> dict[str, list[float]]:
        """The rewards of the rows, by script marker."""
        found: dict[str, list[float]] = {}
        for row in self.rows:
            found.setdefault(marker_of(row), []).append(row.get("reward"))
        return found


def marker_of(row: dict) -> str:
    params = row.get("responses_create_params") or {}
    text = " ".join(_text(m.get("content")) for m in params.get("input") or [] if isinstance(m, dict))
    return next((n for n in ("unknown_then_oracle", "oracle", "noop") if MARKER.format(n) in text), "?")


def _tail(path: Path, n: int = 6000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def _wait_for(predicate: Callable[[], bool], timeout: float, what: str, dead: Callable[[], str | None]) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        why = dead()
        if why:
            raise RuntimeError(f"{what}: {why}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: timed out after {timeout:.0f}s")
        time.sleep(0.5)


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


CONFIG_PATHS = (f"{RESOURCES_DIR}/configs/patchgym.yaml", "policy_model.yaml")
# NeMo Gym's own session-contract check, run in the root (0.7.0+) against patchgym serve's routes over
# HTTP: a small FastAPI app forwards each request (body, cookies) to the server and its answer back.
CONTRACT_CHECK = r'''
import sys, uuid
import httpx
from fastapi import FastAPI, Request, Response
from nemo_gym.base_resources_server import ResourcesSeedSessionRequest
from nemo_gym.episode_types import EpisodeId, TaskId
from nemo_gym.testing.session_conformance import check_resources_session_contract

base, instance_id = sys.argv[1:3]
app = FastAPI()


@app.post("/{path:path}")
async def forward(path: str, request: Request) -> Response:
    headers = {k: v for k, v in request.headers.items() if k in ("content-type", "cookie")}
    async with httpx.AsyncClient(base_url=base, timeout=300) as client:  # fresh: no cookie jar between calls
        answer = await client.post("/" + path, content=await request.body(), headers=headers)
    response = Response(answer.content, status_code=answer.status_code, media_type=answer.headers.get("content-type"))
    for value in answer.headers.get_list("set-cookie"):
        response.headers.append("set-cookie", value)
    return response


seed = ResourcesSeedSessionRequest(resources_session_id=f"conformance-{uuid.uuid4().hex}",
                                   episode_id=EpisodeId(rollout_id="conformance"),
                                   task_id=TaskId(taskset="patchgym", task_id=instance_id),
                                   task_data={"instance_id": instance_id})
check_resources_session_contract(app, seed, keeps_state=True)
print("check_resources_session_contract: passed")
'''
CHROOT_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1",
              "PYTHONUNBUFFERED": "1", "NO_PROXY": "*", "no_proxy": "*"}


class Stack:
    """``patchgym serve``, the scripted model and NeMo Gym's launcher (``gym env start``) in a fresh
    network namespace; call :meth:`collect` for each ``gym eval run --no-serve``. A context manager:
    on exit every process in the namespace is killed, the namespace deleted and the run directory
    removed (copied to ``keep`` first, when given)."""

    def __init__(self, *, release: Release = NEMO_GYM_04, max_sessions: int = 2, tasks: Path = DEFAULT_TASKS,
                 instance_id: str = DEFAULT_INSTANCE, progress: Progress = None, keep: Path | None = None) -> None:
        self.release = release
        self.max_sessions = max_sessions
        self.tasks = tasks
        self.instance_id = instance_id
        self.progress = progress
        self.keep = keep or (Path(os.environ["PATCHGYM_NEMO_GYM_KEEP"]) if os.environ.get("PATCHGYM_NEMO_GYM_KEEP")
                             else None)
        self.seconds: dict[str, float] = {}
        self.how = "?"
        self._procs: list[subprocess.Popen] = []
        self._logs: list = []
        self._count = 0
        self.ns: Netns | None = None
        self.run_dir: Path | None = None

    # -- setup
    def _host_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NEMO_GYM")}
        home = os.environ.get("PATCHGYM_NEMO_GYM_HOME") or _IMPORT_HOME
        if home:  # the task venvs and checkouts are caches too: reuse the ones the warm-up made
            env["PATCHGYM_HOME"] = home
        else:
            env.pop("PATCHGYM_HOME", None)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(patchgym_tree()), str(REPO_ROOT), env.get("PYTHONPATH")]))
        return env

    def _start(self, name: str, argv: list[str], cwd: Path | None = None) -> tuple[subprocess.Popen, Path]:
        log_path = self.run_dir / f"{name}.log"
        fh = log_path.open("wb")
        self._logs.append(fh)
        p = subprocess.Popen(self.ns.argv(argv), stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=self.env, cwd=cwd or patchgym_tree(), start_new_session=True)
        self._procs.append(p)
        return p, log_path

    @staticmethod
    def _dead(*entries: tuple[str, subprocess.Popen, Path]) -> Callable[[], str | None]:
        def check() -> str | None:
            for name, p, log_path in entries:
                if p.poll() is not None:
                    return f"{name} exited {p.returncode}:\n{_tail(log_path)}"
            return None
        return check

    def __enter__(self) -> Stack:
        try:
            self._setup()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _setup(self) -> None:
        started = time.monotonic()
        self.root = ensure_root(self.progress, self.release)
        self.seconds["root"] = time.monotonic() - started
        self.env = self._host_env()
        # warm-up outside the namespace: the task's environment (venv from PyPI, checkout) if missing
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="pg-nemo-warm-") as warm:
            proc = subprocess.run([*_patchgym_cli(), "eval", "--predictions", "gold", "--tasks", str(self.tasks),
                                   "--instance-ids", self.instance_id, "--output", warm], capture_output=True,
                                  text=True, env=self.env, cwd=patchgym_tree())
            if proc.returncode != 0:
                raise RuntimeError(f"warm-up `patchgym eval --predictions gold` failed:\n{proc.stdout[-3000:]}\n"
                                   f"{proc.stderr[-3000:]}")
        self.seconds["warm_up"] = time.monotonic() - started
        _say(self.progress, f"warm-up (gold eval) in {self.seconds['warm_up']:.1f}s")

        self.run_dir = Path(tempfile.mkdtemp(prefix="pg-nemo-run-"))
        self.run_dir.chmod(0o1777)
        (self.run_dir / "home").mkdir()
        self.work = self.run_dir / "work"
        self.work.mkdir()
        if self.release is NEMO_GYM_04:  # the docs' `mkdir -p results`: 0.7.0 makes it itself
            (self.work / "results").mkdir()
        self.how = write_nemo_dir(self.work, self.tasks, self.instance_id, PATCHGYM_PORT, env=self.env,
                                  release=self.release)
        (self.work / "policy_model.yaml").write_text(MODEL_YAML)
        scripts = self.run_dir / "scripts.json"
        scripts.write_text(json.dumps(case_scripts(gold_patch(self.tasks, self.instance_id))))
        self.base_row = dataset_rows(self.tasks, self.instance_id, ["-"], env=self.env)[0]

        self.ns = Netns("pg-nemo").__enter__()
        started = time.monotonic()
        self.serve, self.serve_log = self._start("serve", [
            *_patchgym_cli(), "serve", "--host", "127.0.0.1", "--port", str(PATCHGYM_PORT), "--backend", "local",
            "--max-sessions", str(self.max_sessions), "--tasks", str(self.tasks)])
        ready = self.run_dir / "model.ready"
        model, model_log = self._start("model", [sys.executable, "-m", "tests.nemo_gym_real", "model", "--port",
                                                 str(MODEL_PORT), "--scripts", str(scripts), "--ready", str(ready)],
                                       cwd=REPO_ROOT)
        _wait_for(ready.exists, 60, "the scripted model did not start", self._dead(("model", model, model_log)))
        self.ng_run, self.ng_run_log = self._start("gym-env-start", chroot_argv(self.root, [
            "gym", "env", "start", *[f"--config={path}" for path in CONFIG_PATHS], f"+uv_venv_dir={SERVER_VENVS}",
            "+skip_venv_if_present=true"], run_dir=self.run_dir, env=CHROOT_ENV, cwd=WORK))
        _wait_for(lambda: "servers ready!" in _tail(self.ng_run_log, 400000), 300, "gym env start did not get ready",
                  self._dead(("gym env start", self.ng_run, self.ng_run_log),
                             ("patchgym serve", self.serve, self.serve_log)))
        self.seconds["start"] = time.monotonic() - started
        _say(self.progress, f"patchgym serve, scripted model and NeMo Gym {self.release.version} ready in "
                            f"{self.seconds['start']:.1f}s (resources server dir: {self.how})")

    # -- one collection
    def rows(self, markers: list[str]) -> list[dict]:
        rows = []
        for marker in markers:
            row = json.loads(json.dumps(self.base_row))
            user = next(m for m in row["responses_create_params"]["input"] if m.get("role") == "user")
            user["content"] = user["content"].replace(MARKER.format("-"), MARKER.format(marker))
            rows.append(row)
        return rows

    def collect(self, markers: list[str], *, parallel: int, timeout: float = 600.0) -> Collection:
        self._count += 1
        name = f"collect-{self._count}"
        inp = self.work / f"{name}.jsonl"
        inp.write_text("".join(json.dumps(r) + "\n" for r in self.rows(markers)))
        out = f"{WORK}/results/{name}.jsonl"
        started = time.monotonic()
        proc, log_path = self._start(name, self.in_root(["gym", "eval", "run", "--no-serve", "--agent", AGENT_NAME,
                                                         "--input", f"{WORK}/{inp.name}", "--output", out,
                                                         "--concurrency", str(parallel)]))
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = -1
        seconds = time.monotonic() - started
        results = self.work / "results"
        metrics = results / f"{name}_aggregate_metrics.json"
        return Collection(rows=_jsonl(results / f"{name}.jsonl"), failures=_jsonl(results / f"{name}_failures.jsonl"),
                          returncode=rc, log=_tail(log_path, 20000), seconds=seconds,
                          metrics=json.loads(metrics.read_text()) if metrics.exists() else None)

    def in_root(self, argv: list[str]) -> list[str]:
        """``argv`` run in the release's root, in the run's working directory (which holds the config)."""
        return chroot_argv(self.root, argv, run_dir=self.run_dir, env=CHROOT_ENV, cwd=WORK)

    def run_in_root(self, name: str, argv: list[str], timeout: float = 300) -> tuple[int, str]:
        """``argv`` run in the root inside the namespace, to its end: its exit code and output."""
        proc, log_path = self._start(name, self.in_root(argv))
        try:
            return proc.wait(timeout=timeout), _tail(log_path, 20000)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return -1, _tail(log_path, 20000)

    def check_session_contract(self) -> tuple[int, str]:
        """NeMo Gym's own ``check_resources_session_contract`` (0.7.0+) against the running
        ``patchgym serve``, through its HTTP routes (:data:`CONTRACT_CHECK`)."""
        script = self.run_dir / "contract_check.py"
        script.write_text(CONTRACT_CHECK)
        return self.run_in_root("contract-check", [f"{NEMO_VENV}/bin/python", f"{RUN_TMP}/{script.name}",
                                                   f"http://127.0.0.1:{PATCHGYM_PORT}", self.instance_id])

    def patchgym_metrics(self) -> dict[str, float]:
        """``patchgym serve``'s ``/metrics``, as ``{"name{labels}": value}``."""
        code = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=30).read().decode())"
        text = subprocess.run(self.ns.argv([sys.executable, "-c", code, f"http://127.0.0.1:{PATCHGYM_PORT}/metrics"]),
                              capture_output=True, text=True, check=True).stdout
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line and not line.startswith("#")}

    def logs(self) -> str:
        """The tails of the launcher's and patchgym serve's logs, for failure messages."""
        return (f"--- gym env start ---\n{_tail(self.ng_run_log, 6000)}\n"
                f"--- patchgym serve ---\n{_tail(self.serve_log, 4000)}"
                if self.run_dir else "")

    # -- teardown
    def __exit__(self, *exc) -> None:
        try:
            if self.ns is not None:
                self.ns.__exit__(None, None, None)
                self.ns = None
        finally:
            for p in self._procs:
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
            for fh in self._logs:
                fh.close()
            if self.run_dir is not None:
                try:
                    if self.keep is not None:  # the logs and NeMo Gym's files, not Ray's sockets
                        shutil.copytree(self.run_dir, self.keep, dirs_exist_ok=True, symlinks=True,
                                        ignore=shutil.ignore_patterns("ray", "pymp-*", "*wandb*", "home"))
                finally:
                    shutil.rmtree(self.run_dir, ignore_errors=True)
                self.run_dir = None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.nemo_gym_real")
    sub = parser.add_subparsers(dest="command", required=True)
    model = sub.add_parser("model", help="serve the scripted OpenAI Responses model")
    model.add_argument("--port", type=int, required=True)
    model.add_argument("--scripts", type=Path, required=True)
    model.add_argument("--ready", type=Path)
    args = parser.parse_args(argv)
    serve_model(args.port, json.loads(args.scripts.read_text()), args.ready)
    return 0


if __name__ == "__main__":
    sys.exit(main())
