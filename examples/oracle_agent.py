"""Oracle agent: applies each task's gold patch through RepoEnv's tools, then submits.

    python examples/oracle_agent.py [--tasks PATH] [--instance-ids a,b] [--backend local]
    python examples/oracle_agent.py --url http://127.0.0.1:8000 [--token T] [--tasks PATH]

An example of driving ``patchgym/RepoEnv-v0`` in-process, or with ``--url`` the same oracle through
``patchgym/Remote-v0`` (a patchgym server, ``patchgym serve``): the task ids then come from the
server (``GET /v1/tasks``), and the gold patches, which a server never shows, from the local
catalog (``--tasks``, default the bundled one: pass the file the server serves). It is a check
that the environment's tools can express every gold fix: for each file of the gold diff it reads
the file (``bash cat``; in base64 chunks if the output limit cuts it), turns each hunk into a
``str_replace_editor str_replace`` (old_str = context + removed lines, new_str = context + added
lines, widened with the file's surrounding lines until old_str is unique — at worst the whole
file), creates new files with ``create`` and removes deleted ones with ``rm``.
Every step must succeed; then ``submit`` grades the workspace. The last line printed is
``resolved N/M``; the exit status is 0 only if every task resolved.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import re
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import httpx

import patchgym
import patchgym.gym_envs  # noqa: F401  (importing registers the environments)
import patchgym.server  # noqa: F401  (registers patchgym/Remote-v0)
from patchgym.grading.patches import split_diff
from patchgym.server.client import RemoteEnvError

HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
BEGIN = "<<<ORACLE-BOF>>>"
END = "<<<ORACLE-EOF>>>"


class OracleError(RuntimeError):
    """A step did not do what the oracle asked: the environment (or the patch) is at fault."""


@dataclass
class Hunk:
    start: int        # 0-based index in the old file of the first old line (the insertion point if none)
    old: list[str]    # old lines (context + removed), each with its newline unless "\ No newline"
    new: list[str]    # new lines (context + added)


def parse_hunks(section: str) -> list[Hunk]:
    """The hunks of one file's section of a unified diff, read by the counts in their headers."""
    lines, hunks, n = section.split("\n"), [], 0
    while n < len(lines):
        header = HUNK_HEADER.match(lines[n])
        n += 1
        if not header:
            continue
        old_len, new_len = int(header[2] or 1), int(header[4] or 1)
        old: list[str] = []
        new: list[str] = []
        tag = " "
        while n < len(lines) and (len(old) < old_len or len(new) < new_len or lines[n].startswith("\\")):
            line, n = lines[n], n + 1
            if line.startswith("\\"):  # "\ No newline at end of file": the previous line has none
                for side in {" ": (old, new), "-": (old,), "+": (new,)}[tag]:
                    side[-1] = side[-1][:-1]
                continue
            tag, text = (line[:1] or " "), line[1:]
            if tag in " -":
                old.append(text + "\n")
            if tag in " +":
                new.append(text + "\n")
        start = int(header[1]) - 1 if old_len else int(header[1])
        hunks.append(Hunk(start, old, new))
    return hunks


def occurrences(text: str, sub: str) -> int:
    return len(re.findall(f"(?={re.escape(sub)})", text))  # overlapping ones too


def file_lines(text: str) -> list[str]:
    return re.findall(r"[^\n]*\n|[^\n]+\Z", text)


class Oracle:
    def __init__(self, env: gym.Env) -> None:
        self.env = env
        self.steps = 0

    def call(self, name: str, **arguments) -> str:
        """One tool call that must succeed (and, for bash, exit 0)."""
        obs, _, terminated, truncated, info = self.env.step({"name": name, "arguments": arguments})
        self.steps += 1
        if info["invalid_action"] or info["error"] is not None or terminated or truncated \
                or info.get("exit_code") not in (None, 0):
            shown = {k: (v if len(str(v)) < 200 else str(v)[:200] + "...") for k, v in arguments.items()}
            raise OracleError(f"{name} {shown} failed: error={info['error']!r} exit_code={info.get('exit_code')} "
                              f"terminated={terminated} truncated={truncated}\n{obs[-1000:]}")
        return obs

    def read(self, path: str) -> str:
        """A file's exact content: its size, then the bytes, then a marker (bash adds an exit-code line).
        If the environment's output limit cut it (a server's default is 16,000 characters), read it
        again in chunks."""
        quoted = shlex.quote(path)
        obs = self.call("bash", command=f"wc -c < {quoted} && cat -- {quoted} && printf %s {shlex.quote(END)}")
        size, _, rest = obs.partition("\n")
        content = rest.rpartition(END)[0]
        if END not in rest or len(content.encode()) != int(size):
            return self.read_chunked(path, int(size))
        return content

    def read_chunked(self, path: str, size: int, chunk: int = 8192) -> str:
        """A file read as base64 chunks between markers, halving the chunk while the output is cut
        (a cut leaves a note inside, or drops a marker: either fails the strict decode)."""
        data = b""
        while len(data) < size:
            command = (f"printf %s {shlex.quote(BEGIN)} && tail -c +{len(data) + 1} -- {shlex.quote(path)} "
                       f"| head -c {chunk} | base64 -w0 && printf %s {shlex.quote(END)}")
            obs = self.call("bash", command=command)
            encoded = obs.partition(BEGIN)[2].rpartition(END)[0]
            try:
                piece = base64.b64decode(encoded, validate=True) if BEGIN in obs and END in obs else None
            except binascii.Error:
                piece = None
            if piece is None or len(piece) != min(chunk, size - len(data)):
                if chunk <= 64:
                    raise OracleError(f"could not read {path}: even {chunk}-byte chunks come back cut")
                chunk //= 2
                continue
            data += piece
        try:
            return data.decode()
        except UnicodeDecodeError as exc:
            raise OracleError(f"{path} is not UTF-8 text: {exc}") from None

    def edit(self, path: str, hunks: list[Hunk]) -> None:
        content = self.read(path)
        for hunk in reversed(hunks):  # bottom up: the line numbers of the hunks above stay valid
            lines, block, n = file_lines(content), "".join(hunk.old), len(hunk.old)
            at = [i for i in range(len(lines) - n + 1) if "".join(lines[i:i + n]) == block]
            if not at:
                raise OracleError(f"{path}: hunk at line {hunk.start + 1} does not match the file")
            i = min(at, key=lambda i: abs(i - hunk.start))  # git-apply-style offset, nearest first
            for k in range(len(lines) + 1):  # widen by k lines each side until old_str is unique
                before, after = "".join(lines[max(0, i - k):i]), "".join(lines[i + n:i + n + k])
                old_str, new_str = before + block + after, before + "".join(hunk.new) + after
                if old_str and occurrences(content, old_str) == 1:
                    break
            else:  # the file is empty: there is nothing to anchor a replacement on
                self.call("bash", command=f"rm -- {shlex.quote(path)}")
                self.call("str_replace_editor", command="create", path=path, file_text="".join(hunk.new))
                content = "".join(hunk.new)
                continue
            self.call("str_replace_editor", command="str_replace", path=path, old_str=old_str, new_str=new_str)
            content = content.replace(old_str, new_str, 1)

    def apply(self, patch: str) -> None:
        for section in split_diff(patch):
            header = section.text.split("\n@@", 1)[0]
            if "GIT binary patch" in header or "\nBinary files " in header:
                raise OracleError(f"{section.new_path or section.old_path}: binary patches are not supported")
            old, new, hunks = section.old_path, section.new_path, parse_hunks(section.text)
            if new is None:
                self.call("bash", command=f"rm -- {shlex.quote(old)}")
            elif old is None:
                self.call("str_replace_editor", command="create", path=new,
                          file_text="".join(line for h in hunks for line in h.new))
            else:
                if old != new:
                    self.call("bash", command=f"mkdir -p -- {shlex.quote(str(Path(new).parent))} && "
                                              f"mv -- {shlex.quote(old)} {shlex.quote(new)}")
                if hunks:
                    self.edit(new, hunks)


def run_task(env: gym.Env, instance_id: str, patch: str) -> tuple[bool, str]:
    _, info = env.reset(options={"task_id": instance_id})
    oracle = Oracle(env)
    if not info.get("infrastructure_failure"):
        oracle.apply(patch)
    _, reward, terminated, _, info = env.step({"name": "submit", "arguments": {}})
    if not terminated:
        raise OracleError(f"submit did not terminate the episode (info: {info})")
    if info.get("infrastructure_failure"):
        return False, f"infrastructure failure: {info.get('infrastructure_failure_reason')}"
    return bool(info["resolved"]), f"reward {reward:g}, {oracle.steps + 1} steps"


def remote_task_ids(url: str, token: str | None) -> list[str]:
    """The ids of the tasks a server serves, in its order (``GET /v1/tasks``)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.get(f"{url.rstrip('/')}/v1/tasks", headers=headers, timeout=60)
    if response.status_code != 200:
        raise RemoteEnvError(response.status_code, response.text[:500])
    return [task["instance_id"] for task in response.json()]


def choose_tasks(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(instance id, gold patch) of each task to run: the local catalog's, or with ``--url`` the
    server's ids with the local catalog's patches. Raises ValueError for an id nobody knows."""
    task_set = patchgym.load_task_set(args.tasks)
    wanted = args.instance_ids.split(",") if args.instance_ids else None
    if not args.url:
        return [(t.instance_id, t.patch) for t in task_set.select(wanted)]
    served = remote_task_ids(args.url, args.token)
    unknown = [i for i in wanted or [] if i not in served]
    if unknown:
        raise ValueError(f"the server does not serve {', '.join(unknown)}")
    ids = [i for i in served if wanted is None or i in wanted]
    local = {t.instance_id: t for t in task_set}
    missing = [i for i in ids if i not in local]
    if missing:
        raise ValueError(f"no gold patch for {', '.join(missing)} in the local catalog (pass --tasks with the "
                         "task file the server serves)")
    return [(i, local[i].patch) for i in ids]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", help="task file or directory (default: the bundled catalog)")
    parser.add_argument("--instance-ids", help="comma-separated instance ids (default: all)")
    parser.add_argument("--backend", default="local", help="sandbox backend (in-process only)")
    parser.add_argument("--url", help="a patchgym server: run through patchgym/Remote-v0 instead of in-process")
    parser.add_argument("--token", help="bearer token for --url")
    args = parser.parse_args()
    try:
        tasks = choose_tasks(args)
    except (patchgym.TaskFileError, patchgym.UnknownTaskError, ValueError, httpx.HTTPError,
            RemoteEnvError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    # room for every edit; in-process, whole files readable (a server keeps its own output limit)
    if args.url:
        env = gym.make("patchgym/Remote-v0", url=args.url, token=args.token, max_steps=10_000)
    else:
        env = gym.make("patchgym/RepoEnv-v0", tasks=args.tasks, backend=args.backend,
                       max_steps=10_000, output_limit=1 << 20)
    resolved = 0
    try:
        for instance_id, patch in tasks:
            started = time.monotonic()
            try:
                ok, detail = run_task(env, instance_id, patch)
            except OracleError as exc:
                ok, detail = False, f"FAILED: {exc}"
            resolved += ok
            verdict = "resolved" if ok else "NOT RESOLVED"
            print(f"{instance_id}: {verdict} ({detail}; {time.monotonic() - started:.1f}s)", flush=True)
    finally:
        env.close()
    print(f"resolved {resolved}/{len(tasks)}")
    return 0 if resolved == len(tasks) else 1


if __name__ == "__main__":
    sys.exit(main())
