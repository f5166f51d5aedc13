"""A NeMo Gym server directory for patchgym: what NeMo Gym's launcher (``gym env start`` in 0.7.0,
``ng_run`` in 0.4.0) needs to run patchgym as one of its resources servers, written by ``patchgym
nemo-gym init``.

The launcher accepts only server entries with an ``entrypoint`` (a resources server also needs a
``domain``; a train or validation dataset a ``license``), and it looks for an entry's directory
under the working directory first: ``resources_servers/<name>/`` with a ``requirements.txt``,
which it turns into a venv. So patchgym gets such a directory: the launcher
(:mod:`patchgym.server.nemo_gym.launcher`) as ``app.py``, an empty ``requirements.txt`` (the venv needs
only NeMo Gym, which the launcher installs itself), the dataset, and one config: the resources
server and a ``simple_agent`` that uses it, and for NeMo Gym 0.7.0 its environment server in front
of that agent (``single_agent_turn_legacy``: the typed protocol, seeded, verified and closed per
episode, from the same flat rows). 0.7.0 without it puts a deprecated ``legacy_agent`` relay there,
which never closes a session; 0.4.0 tries to start every entry it finds, so it gets no such entry
(:data:`NEMO_GYM_VERSIONS`).
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from patchgym.server.nemo_gym.dataset import nemo_gym_dataset_rows
from patchgym.tasks.catalog import TaskSet

SERVER_NAME = "patchgym"
RESOURCES_KEY = "patchgym_resources_server"
ENVIRONMENT_KEY = "patchgym_environment_server"
ENVIRONMENT_SERVER = "single_agent_turn_legacy"  # 0.7.0's typed single-agent turn, fed flat rows
CLEANUP_SECONDS = 180  # how long 0.7.0's environment server gives an episode's closes
# The releases a config can be written for: "0.7" (0.7.0 and later: with the environment server) and
# "0.4" (0.4.0, which knows no environment servers).
NEMO_GYM_VERSIONS = ("0.7", "0.4")
LAUNCHER = Path(__file__).with_name("launcher.py")
# The licenses NeMo Gym 0.4.0 accepts for a dataset (config_types.DatasetConfig.license).
LICENSES = ("Apache 2.0", "MIT", "Creative Commons Attribution 4.0 International",
            "Creative Commons Attribution-ShareAlike 4.0 International", "CC BY-SA 4.0", "CC BY-NC 3.0",
            "NVIDIA Internal Use Only, Do Not Distribute", "NVIDIA Evaluation Dataset License Agreement", "TBD",
            "GNU General Public License v3.0")


@dataclass
class ServerDirOptions:
    """What the written config says. ``external``: patchgym already runs at ``host``/``port`` and
    NeMo Gym starts nothing of it; else NeMo Gym starts ``patchgym serve`` with ``serve_args``
    (on ``port``, or one NeMo Gym picks)."""

    agent_name: str = "patchgym_agent"
    model_server: str = "policy_model"
    host: str | None = None
    port: int | None = None
    external: bool = False
    serve_args: list[str] = field(default_factory=list)
    license: str = "TBD"
    max_steps: int = 100
    nemo_gym_version: str = NEMO_GYM_VERSIONS[0]


def write_server_dir(root: Path, task_set: TaskSet, options: ServerDirOptions) -> Path:
    """Write ``root/resources_servers/patchgym/`` (launcher, requirements, dataset, config); the
    config's path, relative to ``root``, which is where NeMo Gym must start."""
    if options.license not in LICENSES:
        raise ValueError(f"NeMo Gym accepts no dataset license {options.license!r}; one of: {', '.join(LICENSES)}")
    if options.nemo_gym_version not in NEMO_GYM_VERSIONS:
        raise ValueError(f"no config for NeMo Gym {options.nemo_gym_version}; one of: {', '.join(NEMO_GYM_VERSIONS)}")
    if options.external and not options.port:
        raise ValueError("an external patchgym needs its --port (and --host unless it is 127.0.0.1)")
    directory = root / "resources_servers" / SERVER_NAME
    (directory / "configs").mkdir(parents=True, exist_ok=True)
    (directory / "data").mkdir(exist_ok=True)
    shutil.copyfile(LAUNCHER, directory / "app.py")
    (directory / "requirements.txt").write_text(
        "# Nothing: app.py needs only what NeMo Gym installs into this venv itself.\n")
    rows = [json.dumps(row) + "\n" for row in nemo_gym_dataset_rows(task_set, agent_name=options.agent_name)]
    (directory / "data" / "train.jsonl").write_text("".join(rows))
    (directory / "data" / "example.jsonl").write_text("".join(rows[:5]))  # what `gym env test` looks for
    config = directory / "configs" / f"{SERVER_NAME}.yaml"
    config.write_text(render_config(options))
    return config.relative_to(root)


def render_config(options: ServerDirOptions) -> str:
    """The YAML config (values JSON-quoted, which YAML reads as they are)."""
    q = json.dumps
    server = ["      entrypoint: app.py", "      domain: coding"]
    if options.host:
        server.append(f"      host: {q(options.host)}")
    if options.port:
        server.append(f"      port: {options.port}")
    if options.external:
        server.append("      external: true   # patchgym runs already at host:port; NeMo Gym starts nothing of it")
    else:
        server.append(f"      patchgym_command: {q([sys.executable, '-m', 'patchgym.cli'])}")
        server.append(f"      serve_args: {q(options.serve_args)}")
    data = f"resources_servers/{SERVER_NAME}/data/train.jsonl"
    environment = [] if options.nemo_gym_version == "0.4" else [
        "# NeMo Gym runs each episode through this: typed seed, the agent's turn, verify, close_session.",
        f"{ENVIRONMENT_KEY}:",
        "  environment_servers:",
        f"    {ENVIRONMENT_SERVER}:",
        "      entrypoint: app.py",
        f"      resources_server: {{type: resources_servers, name: {RESOURCES_KEY}}}",
        f"      agent_server: {{type: responses_api_agents, name: {options.agent_name}}}",
        "      resources_tool_transports: [direct_http]   # the agent calls patchgym's tool routes",
        f"      cleanup_timeout_seconds: {CLEANUP_SECONDS}",
    ]
    return "\n".join([
        f"# Written by `patchgym nemo-gym init` for NeMo Gym {options.nemo_gym_version}. Start NeMo Gym "
        "(`gym env start`) from the directory that holds resources_servers/.",
        f"{RESOURCES_KEY}:",
        "  resources_servers:",
        f"    {SERVER_NAME}:",
        *server,
        f"{options.agent_name}:",
        "  responses_api_agents:",
        "    simple_agent:",
        "      entrypoint: app.py",
        f"      resources_server: {{type: resources_servers, name: {RESOURCES_KEY}}}",
        f"      model_server: {{type: responses_api_models, name: {options.model_server}}}",
        f"      max_steps: {options.max_steps}   # model turns; patchgym's --max-steps bounds tool calls",
        "      datasets:",
        f"        - {{name: train, type: train, jsonl_fpath: {q(data)}, num_repeats: 1,",
        f"           license: {q(options.license)}}}",
        *environment,
        "",
    ])
