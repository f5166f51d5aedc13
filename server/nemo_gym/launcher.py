"""NeMo Gym's entry point for patchgym: ``patchgym nemo-gym init`` copies this file, as it is, to
``resources_servers/patchgym/app.py``, which NeMo Gym's launcher (``gym env start``; ``ng_run`` in
0.4.0) starts in the server's own venv.

It imports nothing of patchgym (that venv holds NeMo Gym, not patchgym): it reads the server's
entry of NeMo Gym's config and either replaces itself with ``patchgym serve`` on the host and
port NeMo Gym assigned (``patchgym_command``, written by ``init``: the interpreter patchgym is
installed in), or, with ``external: true``, starts nothing and stays up while the patchgym that
already runs at ``host``/``port`` answers, so NeMo Gym can manage a server it does not own.
"""

import json
import os
import sys
import time
import urllib.error
import urllib.request

CONFIG_DICT = "NEMO_GYM_CONFIG_DICT"  # what NeMo Gym's launcher puts in a server's environment
CONFIG_PATH = "NEMO_GYM_CONFIG_PATH"
GONE_AFTER = 60.0  # default seconds an external server may not answer before this entry point gives up


def server_entry() -> dict:
    """This server's entry (``<top level>.resources_servers.<name>``) of NeMo Gym's merged config."""
    text, top = os.environ.get(CONFIG_DICT), os.environ.get(CONFIG_PATH)
    if not text or not top:
        sys.exit(f"patchgym: {CONFIG_DICT} and {CONFIG_PATH} are not set: start this with NeMo Gym's launcher")
    try:
        import yaml  # NeMo Gym's venv has it (omegaconf needs it)
    except ImportError:
        sys.exit("patchgym: PyYAML is not importable in this venv; NeMo Gym's own install brings it")
    config = yaml.safe_load(text)
    try:
        (entry,) = config[top]["resources_servers"].values()
    except (KeyError, TypeError, ValueError):
        sys.exit(f"patchgym: no single resources_servers entry under {top!r} in NeMo Gym's config")
    return entry


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=5) as response:
            return response.status == 200
    except urllib.error.HTTPError as exc:
        return exc.code == 401  # a server with a token: it is up
    except OSError:
        return False


def wait_on(url: str, gone_after: float) -> None:
    """Stay up while the external server answers; exit 1 once it has not for ``gone_after`` seconds
    (ng_run then reports this server dead instead of sending rollouts nowhere)."""
    print(f"patchgym: serving through the patchgym at {url}", flush=True)
    last_seen = time.monotonic()
    while True:
        if answers(url):
            last_seen = time.monotonic()
        elif time.monotonic() - last_seen > gone_after:
            sys.exit(f"patchgym: the server at {url} has not answered for {gone_after:g}s")
        time.sleep(min(5.0, gone_after / 4))


def main() -> None:
    entry = server_entry()
    host, port = entry.get("host") or "127.0.0.1", entry.get("port")
    if not port:
        sys.exit("patchgym: NeMo Gym gave this server no port")
    if "@" in str(host):  # "user:token@address" carries the token for NeMo Gym's client
        host = str(host).rsplit("@", 1)[1]
    if entry.get("external"):
        wait_on(f"http://{host}:{port}", float(entry.get("gone_after") or GONE_AFTER))
        return
    command = [str(word) for word in entry.get("patchgym_command") or ["patchgym"]]
    argv = [*command, "serve", "--host", str(host), "--port", str(port),
            *[str(a) for a in entry.get("serve_args") or []]]
    print("patchgym: " + " ".join(json.dumps(a) if " " in a else a for a in argv), flush=True)
    try:
        os.execvp(argv[0], argv)  # signals from ng_run reach patchgym serve itself
    except OSError as exc:
        sys.exit(f"patchgym: cannot run {argv[0]!r} ({exc}); set patchgym_command in the config to a "
                 "command that runs patchgym on this host")


if __name__ == "__main__":
    main()
