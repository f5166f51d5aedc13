"""Oracle agent: applies each task's gold patch through RepoEnv's tools, then submits.

    python examples/oracle_agent.py [--tasks PATH] [--instance-ids a,b] [--backend local]

An example of driving ``patchgym/RepoEnv-v0`` in-process, and a check that the environment's tools
can express every gold fix: for each file of the gold diff it reads the file (``bash cat``), turns
each hunk into a ``str_replace_editor str_replace`` (old_str = context + removed lines, new_str =
context + added lines, widened with the file's surrounding lines until old_str is unique — at
worst the whole file), creates new files with ``create`` and removes deleted ones with ``rm``.
Every step must succeed; then ``submit`` grades the workspace. The last line printed is
``resolved N/M``; the exit status is 0 only if every task resolved.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gym_envs  # noqa: E402  (importing registers the environments)
from gym_envs.patches import split_diff  # noqa: E402

HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
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
        """A file's exact content: its size, then the bytes, then a marker (bash adds an exit-code line)."""
        quoted = shlex.quote(path)
        obs = self.call("bash", command=f"wc -c < {quoted} && cat -- {quoted} && printf %s {shlex.quote(END)}")
        size, _, rest = obs.partition("\n")
        content = rest.rpartition(END)[0]
        if END not in rest or len(content.encode()) != int(size):
            raise OracleError(f"could not read {path} whole ({size.strip()} bytes; output truncated?)")
        return content

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", help="task file or directory (default: the bundled catalog)")
    parser.add_argument("--instance-ids", help="comma-separated instance ids (default: all)")
    parser.add_argument("--backend", default="local")
    parser.add_argument("--url", help="a remote environment server (reserved)")
    args = parser.parse_args()
    if args.url:
        print("remote environments are not available yet", file=sys.stderr)
        return 2
    try:
        task_set = gym_envs.load_task_set(args.tasks)
        task_set = task_set.select(args.instance_ids.split(",") if args.instance_ids else None)
    except (gym_envs.TaskFileError, gym_envs.UnknownTaskError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    env = gym.make("patchgym/RepoEnv-v0", tasks=task_set, backend=args.backend,
                   max_steps=10_000, output_limit=1 << 20)  # room for every edit, whole files readable
    resolved = 0
    try:
        for task in task_set:
            started = time.monotonic()
            try:
                ok, detail = run_task(env, task.instance_id, task.patch)
            except OracleError as exc:
                ok, detail = False, f"FAILED: {exc}"
            resolved += ok
            verdict = "resolved" if ok else "NOT RESOLVED"
            print(f"{task.instance_id}: {verdict} ({detail}; {time.monotonic() - started:.1f}s)", flush=True)
    finally:
        env.close()
    print(f"resolved {resolved}/{len(task_set)}")
    return 0 if resolved == len(task_set) else 1


if __name__ == "__main__":
    sys.exit(main())
