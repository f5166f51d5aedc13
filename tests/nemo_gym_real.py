"""Run the real NeMo Gym (``ng_run`` + ``ng_collect_rollouts``) against ``patchgym serve``.

NeMo Gym 0.4.0 needs Python >= 3.12; the host has 3.11. So NeMo Gym runs in a Debian trixie root
filesystem (Python 3.13) made with ``debootstrap --variant=minbase`` the way the image tooling makes
its base (:mod:`sandboxes.docker.images`: same mirror, same host CA bundle and pip configuration),
with ``nemo-gym`` in a venv at ``/opt/nemo`` and the uv venvs that ``ng_run`` wants for each server
directory (``simple_agent``, ``openai_model`` and the patchgym resources server) pre-built at
``/opt/ng-venvs`` with NeMo Gym's own :func:`nemo_gym.cli.setup_command.setup_env_command`. At run
time ``ng_run`` gets ``+uv_venv_dir=/opt/ng-venvs +skip_venv_if_present=true``, so it installs
nothing and needs no network. The root is cached under ``cache_dir("nemo-gym")`` keyed by what went
into it, built once under a file lock.

Everything of a run lives in a network namespace that has only ``lo`` (Ray listens on every
interface): ``patchgym serve`` and the scripted model server (host Python), ``ng_run`` and all it
starts, and ``ng_collect_rollouts`` (in the root, through ``chroot``). Each chrooted command runs in
its own private mount namespace (``unshare --mount``) where ``/proc``, ``/dev``, ``/sys`` and a
per-run host directory on ``/tmp`` are mounted, so nothing stays mounted when it exits, whatever
happens. At the end every process in the namespace is killed (Ray daemons included), the namespace
is deleted and the run directory removed.

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

    python -m tests.nemo_gym_real build            # build (or find) the cached root, print its path
    python -m tests.nemo_gym_real model --port P --scripts FILE --ready FILE   # the scripted model
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
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

from tests.netns import Netns

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

NEMO_GYM_VERSION = "0.4.0"
UV_VERSION = "0.13.9"
RELEASE = "trixie"  # Python 3.13
ROOT_LAYOUT = 1  # bump when the build steps change
NEMO_VENV = "/opt/nemo"
SERVER_VENVS = "/opt/ng-venvs"  # ng_run's uv_venv_dir: <type>/<name>/.venv below it
RUN_TMP = "/tmp"  # a per-run host directory is mounted here in every chrooted command
WORK = f"{RUN_TMP}/work"  # ng_run's working directory (holds resources_servers/patchgym)
SERVER_DIRS = ("responses_api_agents/simple_agent", "responses_api_models/openai_model")
RESOURCES_DIR = "resources_servers/patchgym"
AGENT_NAME = "patchgym_agent"
RESOURCES_NAME = "patchgym_resources_server"
MODEL_NAME = "policy_model"
MARKER = "[pg-script:{}]"
DEFAULT_TASKS = REPO_ROOT / "tasks" / "instances" / "dotenvkit.jsonl"
DEFAULT_INSTANCE = "patchgym__dotenvkit-1"
# The requirements.txt of the resources server: its app.py needs only the standard library (NeMo Gym
# itself is always installed into a server venv). Part of the root's key: its venv is pre-built.
RESOURCES_REQUIREMENTS = "# patchgym's app.py needs only the standard library\n"
# The fixed ports inside the namespace (a fresh namespace: all free; outside ng_run's 10001-20000)
PATCHGYM_PORT = 21000
MODEL_PORT = 21001

Progress = Callable[[str], None] | None

# Captured at import, before tests/conftest.py points PATCHGYM_HOME at a per-session temp dir: the
# root (~3 GB, minutes to build) must outlive a test session.
_IMPORT_HOME = os.environ.get("PATCHGYM_HOME")


def _say(progress: Progress, message: str) -> None:
    if progress is not None:
        progress(message)


def cache_root() -> Path:
    """Where built roots are kept: ``$PATCHGYM_NEMO_GYM_CACHE``, else ``cache_dir("nemo-gym")`` of the
    ``PATCHGYM_HOME`` this process started with."""
    explicit = os.environ.get("PATCHGYM_NEMO_GYM_CACHE")
    if explicit:
        path = Path(explicit)
        path.mkdir(parents=True, exist_ok=True)
        return path
    from sandboxes import paths

    saved = os.environ.get("PATCHGYM_HOME")
    try:
        if _IMPORT_HOME is None:
            os.environ.pop("PATCHGYM_HOME", None)
        else:
            os.environ["PATCHGYM_HOME"] = _IMPORT_HOME
        return paths.cache_dir("nemo-gym")
    finally:
        if saved is None:
            os.environ.pop("PATCHGYM_HOME", None)
        else:
            os.environ["PATCHGYM_HOME"] = saved


def missing_requirements() -> list[str]:
    """What this host lacks to run the real NeMo Gym (empty when it has all)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root")
    for tool in ("debootstrap", "ip", "chroot", "unshare", "bwrap"):
        if shutil.which(tool) is None:
            missing.append(tool)
    return missing


# --------------------------------------------------------------------------------------------------
# the root filesystem


# Run inside the root by the build: NeMo Gym's own venv setup for each server directory, with the
# config values ng_run computes itself (ray and openai pinned to the parent's, python_version).
PREBUILD = r'''
import os, subprocess, sys
from pathlib import Path
from platform import python_version
from omegaconf import OmegaConf
from openai import __version__ as openai_version
from ray import __version__ as ray_version
import nemo_gym
from nemo_gym.cli.setup_command import setup_env_command

venv_dir, cache, *dirs = sys.argv[1:]
cfg = OmegaConf.create({
    "head_server_deps": [f"ray[default]=={ray_version}", f"openai=={openai_version}"],
    "uv_venv_dir": venv_dir, "python_version": python_version(), "skip_venv_if_present": False,
    "uv_cache_dir": cache})
for d in dirs:
    path = Path(d) if Path(d).is_absolute() else nemo_gym.PARENT_DIR / d
    command = setup_env_command(path, cfg, path.name)
    print("+", command, flush=True)
    subprocess.run(command, shell=True, executable="/bin/bash", check=True, env={**os.environ, "UV_CACHE_DIR": cache})
    venv = Path(venv_dir, *path.parts[-2:], ".venv")
    assert (venv / "bin" / "python").exists() and (venv / "bin" / "activate").exists(), venv
'''


def root_packages() -> tuple[str, ...]:
    from sandboxes.docker.images import BASE_PACKAGES

    return tuple(dict.fromkeys((*BASE_PACKAGES, "python3-pip", "bash")))


def root_key() -> dict:
    from sandboxes.docker.images import host_mirror

    return {"layout": ROOT_LAYOUT, "release": RELEASE, "packages": list(root_packages()),
            "mirror": host_mirror(), "nemo_gym": NEMO_GYM_VERSION, "uv": UV_VERSION,
            "servers": list(SERVER_DIRS), "resources_requirements": RESOURCES_REQUIREMENTS,
            "prebuild": PREBUILD}


def root_path() -> Path:
    from sandboxes.docker.images import _digest

    return cache_root() / f"root-{RELEASE}-{_digest(root_key())}"


def _host_environ_for(root: Path) -> dict[str, str]:
    """The host's pip, proxy and CA variables, less those naming a host path the root lacks."""
    from sandboxes.docker.images import _host_path, _path_values, build_environ

    env = {}
    for key, value in build_environ().items():
        paths = [p for p in map(_host_path, _path_values(value)) if p]
        if all((root / p.lstrip("/")).exists() for p in paths):
            env[key] = value
    return env


def chroot_argv(root: Path, argv: list[str], *, run_dir: Path | None = None, env: dict[str, str] | None = None,
                cwd: str = "/") -> list[str]:
    """``argv`` run in ``root`` through chroot, in a private mount namespace with /proc, /dev, /sys
    (and ``run_dir`` on /tmp) mounted: the mounts end with the namespace, whatever happens."""
    r = shlex.quote(str(root))
    mounts = [f"mount -t proc proc {r}/proc", f"mount --rbind /dev {r}/dev", f"mount --rbind /sys {r}/sys"]
    if run_dir is not None:
        mounts.append(f"mount --bind {shlex.quote(str(run_dir))} {r}{RUN_TMP}")
    base_env = {"PATH": f"{NEMO_VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "HOME": f"{RUN_TMP}/home" if run_dir is not None else "/root", "LANG": "C.UTF-8"}
    env_words = [f"{k}={v}" for k, v in {**base_env, **(env or {})}.items()]
    inner = " && ".join(mounts) + f" && exec chroot {r} /usr/bin/env -i " + " ".join(map(shlex.quote, env_words))
    inner += f" /bin/sh -c 'cd \"$0\" && exec \"$@\"' {shlex.quote(cwd)} " + " ".join(map(shlex.quote, argv))
    return ["unshare", "--mount", "--propagation", "private", "--fork", "--", "/bin/sh", "-c", inner]


def _build(root: Path, log_file: Path, progress: Progress) -> None:
    from sandboxes.docker.images import (
        DEBOOTSTRAP_TIMEOUT,
        _clean_rootfs,
        _copy_host_trust,
        _run_logged,
        host_mirror,
    )

    mirror = host_mirror()
    packages = root_packages()
    _say(progress, f"debootstrap {RELEASE} from {mirror} (minbase + {', '.join(packages)})")
    _run_logged(["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", RELEASE, str(root), mirror],
                log_file, timeout=DEBOOTSTRAP_TIMEOUT, what=f"debootstrap of {RELEASE}")
    _copy_host_trust(root, log_file, progress)
    if Path("/etc/resolv.conf").is_file():  # for pip and uv at build time only (removed below)
        shutil.copyfile("/etc/resolv.conf", root / "etc" / "resolv.conf")
    env = _host_environ_for(root)
    build_dir = root / "opt" / "ng-build"
    (build_dir / RESOURCES_DIR).mkdir(parents=True)
    (build_dir / RESOURCES_DIR / "requirements.txt").write_text(RESOURCES_REQUIREMENTS)
    (build_dir / "prebuild.py").write_text(PREBUILD)
    _say(progress, f"installing uv=={UV_VERSION} and nemo-gym=={NEMO_GYM_VERSION} into {NEMO_VENV}")
    _run_logged(chroot_argv(root, ["/bin/sh", "-c",
                                   f"python3 -m venv {NEMO_VENV} && {NEMO_VENV}/bin/pip install --no-input "
                                   f"uv=={UV_VERSION} nemo-gym=={NEMO_GYM_VERSION}"], env=env),
                log_file, timeout=3600, what="pip install nemo-gym in the root")
    _say(progress, f"pre-building ng_run's server venvs in {SERVER_VENVS}")
    _run_logged(chroot_argv(root, [f"{NEMO_VENV}/bin/python", "/opt/ng-build/prebuild.py", SERVER_VENVS,
                                   "/opt/ng-build/uv-cache", f"/opt/ng-build/{RESOURCES_DIR}", *SERVER_DIRS], env=env),
                log_file, timeout=3600, what="pre-building NeMo Gym's server venvs")
    shutil.rmtree(build_dir / "uv-cache", ignore_errors=True)  # the venvs keep their hard links
    _clean_rootfs(root)  # also drops resolv.conf: nothing resolves names at run time
    (root / "tmp").mkdir(exist_ok=True)
    (root / "tmp").chmod(0o1777)
    (root / "pg-root.json").write_text(json.dumps(root_key(), indent=2) + "\n")


def ensure_root(progress: Progress = None) -> Path:
    """The cached root filesystem, built first if missing (under a lock: once across processes)."""
    from sandboxes.docker.images import _remove_rootfs
    from sandboxes.locks import file_lock

    root = root_path()
    if (root / "pg-root.json").is_file():
        return root
    missing = missing_requirements()
    if missing:
        raise RuntimeError(f"building the NeMo Gym root needs: {', '.join(missing)}")
    with file_lock(root.with_name(root.name + ".lock")):
        if (root / "pg-root.json").is_file():
            return root
        started = time.monotonic()
        work = root.with_name(f"{root.name}.build-{uuid.uuid4().hex[:8]}")
        log_file = root.with_name(root.name + ".log")
        log_file.write_text("")
        try:
            (work / "rootfs").mkdir(parents=True)
            _build(work / "rootfs", log_file, progress)
            if root.exists():  # a half-made leftover without pg-root.json
                _remove_rootfs(root)
            (work / "rootfs").rename(root)
        finally:
            _remove_rootfs(work)
        _say(progress, f"built {root} in {time.monotonic() - started:.0f}s (log: {log_file})")
    return root


# --------------------------------------------------------------------------------------------------
# the network namespace


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
    from gym_envs import load_tasks

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


def has_init_command(env: dict[str, str]) -> bool:
    proc = subprocess.run([*_patchgym_cli(), "nemo-gym", "init", "--help"], capture_output=True, env=env,
                          cwd=patchgym_tree())
    return proc.returncode == 0


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
                   max_steps: int = 30) -> str:
    """The NeMo Gym side of patchgym in ``work``; returns how it was made ("init" or "fallback")."""
    if has_init_command(env):
        subprocess.run([*_patchgym_cli(), "nemo-gym", "init", str(work), "--tasks", str(tasks), "--instance-ids",
                        instance_id, "--external", "--host", "127.0.0.1", "--port", str(port)],
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


CHROOT_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1",
              "PYTHONUNBUFFERED": "1", "NO_PROXY": "*", "no_proxy": "*"}


class Stack:
    """``patchgym serve``, the scripted model and ``ng_run`` in a fresh network namespace; call
    :meth:`collect` for each ``ng_collect_rollouts``. A context manager: on exit every process in
    the namespace is killed, the namespace deleted and the run directory removed (copied to
    ``keep`` first, when given)."""

    def __init__(self, *, max_sessions: int = 2, tasks: Path = DEFAULT_TASKS, instance_id: str = DEFAULT_INSTANCE,
                 progress: Progress = None, keep: Path | None = None) -> None:
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
        self.root = ensure_root(self.progress)
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
        (self.work / "results").mkdir(parents=True)
        self.how = write_nemo_dir(self.work, self.tasks, self.instance_id, PATCHGYM_PORT, env=self.env)
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
        config_paths = f"[{RESOURCES_DIR}/configs/patchgym.yaml,policy_model.yaml]"
        self.ng_run, self.ng_run_log = self._start("ng_run", chroot_argv(self.root, [
            "ng_run", f"+config_paths={config_paths}", f"+uv_venv_dir={SERVER_VENVS}", "+skip_venv_if_present=true"],
            run_dir=self.run_dir, env=CHROOT_ENV, cwd=WORK))
        _wait_for(lambda: "servers ready!" in _tail(self.ng_run_log, 400000), 300, "ng_run did not get ready",
                  self._dead(("ng_run", self.ng_run, self.ng_run_log), ("patchgym serve", self.serve, self.serve_log)))
        self.seconds["start"] = time.monotonic() - started
        _say(self.progress, f"patchgym serve, scripted model and ng_run ready in {self.seconds['start']:.1f}s "
                            f"(resources server dir: {self.how})")

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
        proc, log_path = self._start(name, chroot_argv(self.root, [
            "ng_collect_rollouts", f"+agent_name={AGENT_NAME}", f"+input_jsonl_fpath={WORK}/{inp.name}",
            f"+output_jsonl_fpath={out}", f"+num_samples_in_parallel={parallel}", "+upload_rollouts_to_wandb=false"],
            run_dir=self.run_dir, env=CHROOT_ENV, cwd=WORK))
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

    def logs(self) -> str:
        """The tails of ng_run's and patchgym serve's logs, for failure messages."""
        return (f"--- ng_run ---\n{_tail(self.ng_run_log, 6000)}\n--- patchgym serve ---\n{_tail(self.serve_log, 4000)}"
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
    sub.add_parser("build", help="build (or find) the cached NeMo Gym root; print its path")
    model = sub.add_parser("model", help="serve the scripted OpenAI Responses model")
    model.add_argument("--port", type=int, required=True)
    model.add_argument("--scripts", type=Path, required=True)
    model.add_argument("--ready", type=Path)
    args = parser.parse_args(argv)
    if args.command == "build":
        print(ensure_root(progress=lambda m: print(m, file=sys.stderr, flush=True)))
        return 0
    serve_model(args.port, json.loads(args.scripts.read_text()), args.ready)
    return 0


if __name__ == "__main__":
    sys.exit(main())
