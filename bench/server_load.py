"""Load on the HTTP server: N concurrent sessions of S bash steps and a submit, beside the same work in-process.

Each session is ``POST /v1/sessions`` (a RepoEnv reset on a task: a fresh local sandbox), ``--steps``
``bash`` tool calls (a rotation of cheap, realistic commands: ``ls``, ``cat``, ``grep``, ``git``,
``python -c``...), a ``submit`` (the hidden tests run in a fresh sandbox) and ``DELETE``. All sessions
run at once (asyncio, one ``httpx.AsyncClient`` with a connection per session), back to back with no
think time unless ``--think``: a closed loop, the worst case for latency. Tasks: the catalog's, round-robin.

The server is ``patchgym serve`` in its own process (its own GIL, its own process group), started
once with ``--max-sessions`` at least the largest concurrency measured, killed at the end whatever
happens. The in-process peer runs the same sessions, commands and tasks on ``RepoEnv`` objects in a
pool of N threads of this process (no HTTP); remote and in-process runs alternate, so the overhead
ratios (remote / in-process bash-step p50 and p99) compare runs taken minutes apart at most.

Per run: bash-step latency (p50, p90, p99, max), create and submit latency apart, errors by kind
(HTTP status or exception, a bash step whose exit code is not 0, a submit with an infrastructure
failure, a sandbox left behind once every session is deleted: all must be 0), wall time, bash
steps per second, CPU seconds of the Python side (server process and client process; in-process:
this process; sandboxed commands never reach these figures) and of the whole machine (every
process, other users' included), peak summed RSS of the server's process tree (over-counts shared
pages) and the lowest MemAvailable seen. Every figure is reported per run and as the median of ``--repeats`` runs.

``--find-max`` then raises the concurrency (N, 1.5N, 2N, 3N, 4N, ... up to ``--max``), and bisects
between the last level that held and the first that did not (to ``--resolution`` sessions): the
largest concurrency whose median bash-step p99 stays under ``--p99-limit`` seconds with no error.

    python bench/server_load.py [--sessions 64] [--steps 20] [--repeats 3] [--json FILE]
    python bench/server_load.py --find-max [--max 512] [--p99-limit 1.0] [--resolution 16]
    python bench/server_load.py --compare-grading 16,64,128 [--grading-workers N] [--steps 20] [--repeats 3]
        [--episodes 3]

``--compare-grading`` measures only where grading runs (issue 38): two servers, one grading in its
threads (``--grading-workers 0``) and one in its grading workers, and that second one with
sessions that end without a submit (grading elsewhere: the peer), in rotating order per round.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import json
import math
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]

from patchgym.gym_envs.repo_env import RepoEnv  # noqa: E402
from patchgym.sandboxes.paths import cache_dir  # noqa: E402
from patchgym.tasks.catalog import TaskSet, load_task_set  # noqa: E402

# Cheap, read-mostly commands an agent runs while exploring, plus one edit (so the submit has a
# diff to apply). Session i starts at command i, so at any moment the sessions run a mix.
COMMANDS = [
    "ls -la",
    "cat README.md",
    "grep -rn --include='*.py' 'def ' . | head -20",
    "git status",
    "python -c 'print(1)'",
    "git log --oneline -5",
    "find . -name '*.py' -not -path './.git/*' | head -20",
    "sed -n 1,40p $(git ls-files '*.py' | head -1)",
    "echo '<!-- touched by the load bench -->' >> README.md",
    "git diff --stat",
]
SUBMIT = {"name": "submit", "arguments": {}}
PAGE = os.sysconf("SC_PAGE_SIZE")
TICK = os.sysconf("SC_CLK_TCK")


def bash(command: str) -> dict[str, Any]:
    return {"name": "bash", "arguments": {"command": command}}


# -- statistics ---------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def latency(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    ms = [v * 1000 for v in values]
    return {"n": len(ms), "p50_ms": round(percentile(ms, 50), 2), "p90_ms": round(percentile(ms, 90), 2),
            "p99_ms": round(percentile(ms, 99), 2), "max_ms": round(max(ms), 2),
            "mean_ms": round(statistics.fmean(ms), 2)}


@dataclass
class Episode:
    """What one session measured."""

    create: list[float] = field(default_factory=list)
    steps: list[float] = field(default_factory=list)
    submit: list[float] = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)


@dataclass
class Run:
    """One measurement: N sessions at once, remote or in-process."""

    mode: str
    sessions: int
    episodes: list[Episode]
    wall: float
    resources: dict[str, Any]
    extra_errors: Counter = field(default_factory=Counter)

    def summary(self) -> dict[str, Any]:
        steps = [s for e in self.episodes for s in e.steps]
        errors = Counter(self.extra_errors)
        for e in self.episodes:
            errors.update(e.errors)
        return {
            "mode": self.mode, "sessions": self.sessions, "wall_s": round(self.wall, 3),
            "bash": latency(steps),
            "create": latency([s for e in self.episodes for s in e.create]),
            "submit": latency([s for e in self.episodes for s in e.submit]),
            "bash_steps_per_s": round(len(steps) / self.wall, 2) if self.wall else 0.0,
            "errors": sum(errors.values()), "errors_by_kind": dict(sorted(errors.items())),
            **self.resources,
        }


# -- processes and memory -----------------------------------------------------------------


def proc_table() -> dict[int, tuple[int, int, float]]:
    """pid -> (ppid, rss bytes, cpu seconds)."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2:].split()  # fields[0] is the state (field 3 of stat)
        cpu = sum(int(x) for x in fields[11:13]) / TICK  # utime, stime
        table[int(entry.name)] = (int(fields[1]), int(fields[21]) * PAGE, cpu)
    return table


def descendants(root: int, table: dict[int, tuple[int, int, float]]) -> set[int]:
    """``root`` and every live process below it in ``table``."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in table and pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def tree_rss(root: int, table: dict[int, tuple[int, int, float]]) -> int:
    return sum(table[pid][1] for pid in descendants(root, table))


def process_cpu(pid: int) -> float:
    """CPU seconds of one process (all its threads), not of its children: sandboxed commands run
    under bubblewrap and their CPU does not reach the server's rusage, so it is not counted at all
    (see :func:`machine_busy`)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return 0.0
    return sum(int(x) for x in data[data.rfind(b")") + 2:].split()[11:13]) / TICK


def machine_busy() -> float:
    """CPU seconds every core of the machine spent busy so far (all processes, anyone's)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / TICK  # minus idle and iowait; guest is inside user


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def status_kb(pid: int, key: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


Probe = Callable[[dict[int, tuple[int, int, float]]], tuple[int, int]]  # proc table -> (live sandboxes, bytes)


class MemorySampler:
    """Peak summed RSS of a process tree and the lowest MemAvailable, sampled in a thread; with a
    ``probe``, also the memory the live sandboxes hold (bench/capacity.py: cgroups or containers)."""

    def __init__(self, root: int, interval: float, probe: Probe | None = None) -> None:
        self.root, self.interval, self.probe = root, interval, probe
        self.peak_rss = 0
        self.peak_live = 0
        self.per_sandbox: list[float] = []
        self.baseline = self.lowest = mem_available()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="mem-sampler", daemon=True)

    def _sample(self) -> None:
        table = proc_table()
        self.peak_rss = max(self.peak_rss, tree_rss(self.root, table))
        self.lowest = min(self.lowest, mem_available())
        if self.probe is not None:
            live, held = self.probe(table)
            self.peak_live = max(self.peak_live, live)
            if live:
                self.per_sandbox.append(held / live)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> MemorySampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def figures(self) -> dict[str, float]:
        mib = 1 << 20
        out = {"peak_tree_rss_mib": round(self.peak_rss / mib, 1),
               "min_mem_available_mib": round(self.lowest / mib, 1),
               "mem_available_drop_mib": round((self.baseline - self.lowest) / mib, 1)}
        if self.probe is not None:
            out["peak_live_sandboxes"] = self.peak_live
            if self.per_sandbox:  # the median over samples of (memory held / sandboxes live)
                out["sandbox_mib"] = round(statistics.median(self.per_sandbox) / mib, 2)
        return out


def leftovers(owner: int) -> dict[str, list[str]]:
    """What sandboxes owned by process ``owner`` left on this host: workspaces, cgroups, processes."""
    found = {"sandbox_dirs": sorted(str(p) for p in cache_dir("sandboxes").glob(f"{owner}-*")),
             "cgroups": sorted(glob.glob(f"/sys/fs/cgroup/patchgym/sb-{owner}-*")
                               + glob.glob(f"/sys/fs/cgroup/*/patchgym/sb-{owner}-*")
                               + glob.glob(f"/sys/fs/cgroup/*/patchgym-sb-{owner}-*")),
             "processes": []}
    marker = f"/sandboxes/{owner}-".encode()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    if marker in f.read():
                        found["processes"].append(entry.name)
            except OSError:
                pass
    return found


def count_leftovers(found: dict[str, list[str]]) -> Counter:
    return Counter({f"leftover:{kind}": len(items) for kind, items in found.items() if items})


# -- the server ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server_process(max_sessions: int, tasks: str | None, log_path: Path, grading_workers: int | None = None,
                   backend: str = "local", extra: tuple[str, ...] = ()) -> Iterator[tuple[str, int]]:
    """``patchgym serve`` in its own process group; yields (url, pid); SIGTERM then SIGKILL on exit."""
    port = free_port()
    cmd = [sys.executable, "-m", "patchgym.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--max-sessions", str(max_sessions), "--backend", backend, *extra]
    if grading_workers is not None:
        cmd += ["--grading-workers", str(grading_workers)]
    if tasks:
        cmd += ["--tasks", tasks]
    env = {**os.environ, "PATCHGYM_LOG": os.environ.get("PATCHGYM_LOG", "warning"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"the server exited with {proc.returncode}:\n{tail(log_path)}")
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"the server did not answer /healthz within 120 s:\n{tail(log_path)}")
            time.sleep(0.1)
        yield url, proc.pid
    finally:
        stop_process_group(proc)


def stop_process_group(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 60), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait)
    with contextlib.suppress(ProcessLookupError):  # the group's stragglers, if any
        os.killpg(proc.pid, signal.SIGKILL)


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# -- remote sessions ----------------------------------------------------------------------


async def remote_episode(client: httpx.AsyncClient, index: int, task_id: str, steps: int, think: float,
                         submit: bool = True, gold: str | None = None) -> Episode:
    """One session; with ``gold`` (a patch), its first step applies it and the submit must earn 1.0."""
    ep = Episode()

    async def call(phase: str, method: str, path: str, body: Any = None, ok: int = 200) -> Any:
        start = time.perf_counter()
        try:
            response = await client.request(method, path, json=body)
        except httpx.HTTPError as exc:
            ep.errors[f"{phase}:{type(exc).__name__}"] += 1
            return None
        elapsed = time.perf_counter() - start
        if response.status_code != ok:
            ep.errors[f"{phase}:http_{response.status_code}"] += 1
            return None
        if phase in ("create", "submit"):
            getattr(ep, phase).append(elapsed)
        elif phase == "step":
            ep.steps.append(elapsed)
        return response.json() if response.content else {}

    body = await call("create", "POST", "/v1/sessions", {"task_id": task_id, "max_steps": steps + 5}, ok=201)
    if body is None:
        return ep
    if body["info"].get("infrastructure_failure"):
        ep.errors["create:infrastructure_failure"] += 1
    session = f"/v1/sessions/{body['session_id']}"
    try:
        if gold is not None:
            result = await call("step", "POST", f"{session}/step", {"action": bash(apply_command(gold))})
            if result is None:
                return ep
            check_step(ep, result["info"], result["terminated"], result["truncated"])
        for k in range(steps):
            if think:
                await asyncio.sleep(think)
            action = bash(COMMANDS[(index + k) % len(COMMANDS)])
            result = await call("step", "POST", f"{session}/step", {"action": action})
            if result is None:
                return ep
            check_step(ep, result["info"], result["terminated"], result["truncated"])
        result = await call("submit", "POST", f"{session}/step", {"action": SUBMIT}) if submit else None
        if result is not None:
            check_submit(ep, result["info"], result["terminated"])
            if gold is not None and not result["info"].get("infrastructure_failure") and result.get("reward") != 1.0:
                ep.errors["submit:gold_not_rewarded"] += 1
    finally:
        await call("delete", "DELETE", session, ok=204)
    return ep


def apply_command(patch: str) -> str:
    """A bash command that applies ``patch`` in the workspace (a quoted here-document)."""
    return f"git apply --whitespace=nowarn <<'PATCHGYM_GOLD_EOF'\n{patch.rstrip(chr(10))}\nPATCHGYM_GOLD_EOF"


def check_step(ep: Episode, info: dict[str, Any], terminated: bool, truncated: bool) -> None:
    if info.get("invalid_action"):
        ep.errors["step:invalid_action"] += 1
    elif info.get("exit_code") != 0:
        ep.errors["step:exit_code"] += 1
    if terminated or truncated:
        ep.errors["step:episode_ended"] += 1


def check_submit(ep: Episode, info: dict[str, Any], terminated: bool) -> None:
    if info.get("infrastructure_failure"):
        ep.errors["submit:infrastructure_failure"] += 1
    elif not terminated:
        ep.errors["submit:not_terminated"] += 1


async def remote_sessions(url: str, task_ids: list[str], n: int, steps: int, think: float,
                          timeout: float, submit: bool = True, episodes: int = 1,
                          golds: dict[str, str] | None = None) -> tuple[list[Episode], float]:
    """N workers at once, each with its own connection, as N rollout workers would have, each running
    ``episodes`` sessions back to back (``golds``: task id -> the patch its sessions apply first).
    (One pooled httpx client for all of them cost twice the client CPU, which on 2 cores shows up in
    the latencies measured.)"""

    async def one(i: int) -> list[Episode]:
        async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(timeout, connect=30.0)) as client:
            done = []
            for j in range(episodes):
                task_id = task_ids[(i + j * n) % len(task_ids)]
                done.append(await remote_episode(client, i + j * n, task_id, steps, think, submit,
                                                 (golds or {}).get(task_id)))
            return done

    start = time.perf_counter()
    per_worker = await asyncio.gather(*(one(i) for i in range(n)))
    return [ep for worker in per_worker for ep in worker], time.perf_counter() - start


def run_remote(url: str, server_pid: int, task_ids: list[str], n: int, args: argparse.Namespace,
               submit: bool = True, probe: Probe | None = None, episodes_per_worker: int = 1,
               golds: dict[str, str] | None = None) -> Run:
    server_cpu, client_cpu, busy = process_cpu(server_pid), cpu_self(), machine_busy()
    with MemorySampler(server_pid, args.sample_interval, probe) as mem:
        episodes, wall = asyncio.run(remote_sessions(url, task_ids, n, args.steps, args.think, args.timeout,
                                                     submit, episodes_per_worker, golds))
    resources = {"cpu_server_s": round(process_cpu(server_pid) - server_cpu, 2),
                 "cpu_client_s": round(cpu_self() - client_cpu, 2),
                 "cpu_machine_s": round(machine_busy() - busy, 2), **mem.figures(),
                 "server_rss_mib_after": round((status_kb(server_pid, "VmRSS") or 0) / 1024, 1)}
    extra: Counter = Counter()
    try:
        open_sessions = httpx.get(f"{url}/healthz", timeout=30).json()["sessions"]
        if open_sessions:
            extra["leftover:sessions"] = open_sessions
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        extra[f"healthz:{type(exc).__name__}"] += 1
    extra.update(count_leftovers(settled_leftovers(server_pid)))
    return Run("remote", n, episodes, wall, resources, extra)


def settled_leftovers(owner: int, wait: float = 5.0) -> dict[str, list[str]]:
    """Leftovers of ``owner``, allowing closes still in flight a few seconds to finish."""
    deadline = time.monotonic() + wait
    while True:
        found = leftovers(owner)
        if not any(found.values()) or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


# -- in-process sessions ------------------------------------------------------------------


def cpu_self() -> float:
    t = os.times()
    return t.user + t.system


def local_episode(task_set: TaskSet, index: int, task_id: str, steps: int, think: float,
                  stop: threading.Event) -> Episode:
    ep = Episode()
    phase = "create"
    env = None
    try:
        start = time.perf_counter()
        env = RepoEnv(task_set, backend="local", max_steps=steps + 5)
        _, info = env.reset(options={"task_id": task_id})
        ep.create.append(time.perf_counter() - start)
        if info.get("infrastructure_failure"):
            ep.errors["create:infrastructure_failure"] += 1
        phase = "step"
        for k in range(steps):
            if stop.is_set():
                return ep
            if think:
                time.sleep(think)
            start = time.perf_counter()
            _, _, terminated, truncated, info = env.step(bash(COMMANDS[(index + k) % len(COMMANDS)]))
            ep.steps.append(time.perf_counter() - start)
            check_step(ep, info, terminated, truncated)
        phase = "submit"
        start = time.perf_counter()
        _, _, terminated, _, info = env.step(SUBMIT)
        ep.submit.append(time.perf_counter() - start)
        check_submit(ep, info, terminated)
    except Exception as exc:
        ep.errors[f"{phase}:{type(exc).__name__}"] += 1
    finally:
        if env is not None:
            env.close()
    return ep


def run_local(task_set: TaskSet, task_ids: list[str], n: int, args: argparse.Namespace) -> Run:
    stop = threading.Event()
    cpu, busy = cpu_self(), machine_busy()
    with MemorySampler(os.getpid(), args.sample_interval) as mem, ThreadPoolExecutor(n) as pool:
        start = time.perf_counter()
        futures = [pool.submit(local_episode, task_set, i, task_ids[i % len(task_ids)], args.steps, args.think,
                               stop) for i in range(n)]
        try:
            episodes = [f.result() for f in futures]
        except BaseException:  # Ctrl-C: let every thread finish its current call and close its env
            stop.set()
            raise
        wall = time.perf_counter() - start
    resources = {"cpu_inprocess_s": round(cpu_self() - cpu, 2), "cpu_machine_s": round(machine_busy() - busy, 2),
                 **mem.figures()}
    return Run("inprocess", n, episodes, wall, resources, count_leftovers(settled_leftovers(os.getpid())))


# -- reporting ----------------------------------------------------------------------------


def flat(summary: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in summary.items():
        if isinstance(value, dict) and key != "errors_by_kind":
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median of every numeric figure over runs; errors summed, not medianed (all must be 0)."""
    flats = [flat(r) for r in runs]
    out: dict[str, Any] = {}
    for key in flats[0]:
        values = [f.get(key) for f in flats]
        if key == "errors":
            out[key] = sum(values)
        elif key == "errors_by_kind":
            total: Counter = Counter()
            for v in values:
                total.update(v)
            out[key] = dict(sorted(total.items()))
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            out[key] = round(statistics.median(values), 3)
    return out


ROWS = [
    ("remote bash p50 (ms)", "remote", "bash.p50_ms"),
    ("remote bash p90 (ms)", "remote", "bash.p90_ms"),
    ("remote bash p99 (ms)", "remote", "bash.p99_ms"),
    ("remote bash max (ms)", "remote", "bash.max_ms"),
    ("remote create p50 (ms)", "remote", "create.p50_ms"),
    ("remote create p99 (ms)", "remote", "create.p99_ms"),
    ("remote submit p50 (ms)", "remote", "submit.p50_ms"),
    ("remote submit p99 (ms)", "remote", "submit.p99_ms"),
    ("remote wall (s)", "remote", "wall_s"),
    ("remote bash steps/s", "remote", "bash_steps_per_s"),
    ("remote CPU server process (s)", "remote", "cpu_server_s"),
    ("remote CPU client process (s)", "remote", "cpu_client_s"),
    ("remote CPU machine, all (s)", "remote", "cpu_machine_s"),
    ("remote peak tree RSS (MiB)", "remote", "peak_tree_rss_mib"),
    ("remote server RSS after (MiB)", "remote", "server_rss_mib_after"),
    ("remote MemAvailable drop (MiB)", "remote", "mem_available_drop_mib"),
    ("remote errors", "remote", "errors"),
    ("in-process bash p50 (ms)", "inprocess", "bash.p50_ms"),
    ("in-process bash p90 (ms)", "inprocess", "bash.p90_ms"),
    ("in-process bash p99 (ms)", "inprocess", "bash.p99_ms"),
    ("in-process bash max (ms)", "inprocess", "bash.max_ms"),
    ("in-process create p50 (ms)", "inprocess", "create.p50_ms"),
    ("in-process submit p50 (ms)", "inprocess", "submit.p50_ms"),
    ("in-process submit p99 (ms)", "inprocess", "submit.p99_ms"),
    ("in-process wall (s)", "inprocess", "wall_s"),
    ("in-process bash steps/s", "inprocess", "bash_steps_per_s"),
    ("in-process CPU bench process (s)", "inprocess", "cpu_inprocess_s"),
    ("in-process CPU machine, all (s)", "inprocess", "cpu_machine_s"),
    ("in-process peak tree RSS (MiB)", "inprocess", "peak_tree_rss_mib"),
    ("in-process errors", "inprocess", "errors"),
    ("overhead bash p50 (remote/in-process)", "ratio", "bash_p50"),
    ("overhead bash p99 (remote/in-process)", "ratio", "bash_p99"),
    ("overhead submit p50 (remote/in-process)", "ratio", "submit_p50"),
    ("overhead wall (remote/in-process)", "ratio", "wall"),
    ("overhead CPU, Python side (server+client / in-process)", "ratio", "cpu"),
    ("overhead CPU, machine (remote / in-process)", "ratio", "cpu_machine"),
]


def ratios(remote: dict[str, Any], local: dict[str, Any]) -> dict[str, float | None]:
    def div(a: Any, b: Any) -> float | None:
        return round(a / b, 3) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None

    return {"bash_p50": div(remote["bash"].get("p50_ms"), local["bash"].get("p50_ms")),
            "bash_p99": div(remote["bash"].get("p99_ms"), local["bash"].get("p99_ms")),
            "submit_p50": div(remote["submit"].get("p50_ms"), local["submit"].get("p50_ms")),
            "wall": div(remote["wall_s"], local["wall_s"]),
            "cpu": div(remote["cpu_server_s"] + remote["cpu_client_s"], local["cpu_inprocess_s"]),
            "cpu_machine": div(remote["cpu_machine_s"], local["cpu_machine_s"])}


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def print_table(title: str, columns: list[dict[str, dict[str, Any]]], median: dict[str, dict[str, Any]]) -> None:
    """Rows of ROWS (when measured), one column per run, then the median."""
    print(title)
    head = [f"run {i + 1}" for i in range(len(columns))] + ["median"]
    width = max(len(label) for label, _, _ in ROWS)
    print(f"  {'':<{width}}  " + "  ".join(f"{h:>9}" for h in head))
    for label, mode, key in ROWS:
        if mode not in median:
            continue
        cells = [flat(c[mode]).get(key) if mode != "ratio" else c[mode].get(key) for c in columns]
        cells.append(median[mode].get(key))
        print(f"  {label:<{width}}  " + "  ".join(f"{fmt(c):>9}" for c in cells))
    for mode in ("remote", "inprocess"):
        kinds = median.get(mode, {}).get("errors_by_kind")
        if kinds:
            print(f"  {mode} errors by kind (all runs): {kinds}")


# -- the measurements ---------------------------------------------------------------------


def measure(url: str, server_pid: int, task_set: TaskSet, task_ids: list[str], n: int, args: argparse.Namespace,
            compare: bool) -> dict[str, Any]:
    """``args.repeats`` runs at concurrency n (remote, and in-process beside it when ``compare``)."""
    columns: list[dict[str, dict[str, Any]]] = []
    for r in range(args.repeats):
        column: dict[str, dict[str, Any]] = {}
        order = ["remote", "inprocess"] if r % 2 == 0 else ["inprocess", "remote"]
        for mode in order if compare else ["remote"]:
            run = (run_remote(url, server_pid, task_ids, n, args) if mode == "remote"
                   else run_local(task_set, task_ids, n, args))
            column[mode] = run.summary()
            s = column[mode]
            print(f"  [{n} sessions, run {r + 1}/{args.repeats}, {mode}] bash p50 {fmt(s['bash'].get('p50_ms'))} "
                  f"p99 {fmt(s['bash'].get('p99_ms'))} ms, submit p50 {fmt(s['submit'].get('p50_ms'))} ms, "
                  f"wall {s['wall_s']:.1f} s, errors {s['errors']}", file=sys.stderr, flush=True)
        if compare:
            column["ratio"] = ratios(column["remote"], column["inprocess"])
        columns.append(column)
    median: dict[str, dict[str, Any]] = {mode: median_of([c[mode] for c in columns]) for mode in columns[0]
                                         if mode != "ratio"}
    if compare:
        median["ratio"] = {k: round(statistics.median(v), 3) if (v := [c["ratio"][k] for c in columns
                                                                          if c["ratio"][k] is not None]) else None
                           for k in columns[0]["ratio"]}
    return {"sessions": n, "runs": columns, "median": median}


def holds(result: dict[str, Any], limit_s: float) -> bool:
    remote = result["median"]["remote"]
    p99 = remote.get("bash.p99_ms")
    return remote["errors"] == 0 and p99 is not None and p99 < limit_s * 1000


def ladder(start: int, top: int) -> list[int]:
    levels, k = [], 0
    while True:
        level = start * (2 ** (k // 2)) * (3 if k % 2 else 2) // 2  # start, 1.5x, 2x, 3x, 4x, 6x, ...
        if level >= top:
            levels.append(top)
            return sorted(set(levels))
        levels.append(level)
        k += 1


def find_max(url: str, server_pid: int, task_set: TaskSet, task_ids: list[str], args: argparse.Namespace,
             first: dict[str, Any]) -> dict[str, Any]:
    """Ramp the concurrency up the ladder, then bisect; the largest level that held (0 if none)."""
    tried: dict[int, dict[str, Any]] = {first["sessions"]: first}

    def attempt(n: int) -> bool:
        if n not in tried:
            print(f"capacity: {n} sessions", file=sys.stderr, flush=True)
            tried[n] = measure(url, server_pid, task_set, task_ids, n, args, compare=False)
        ok = holds(tried[n], args.p99_limit)
        remote = tried[n]["median"]["remote"]
        print(f"capacity: {n} sessions: bash p99 {fmt(remote.get('bash.p99_ms'))} ms, errors {remote['errors']}"
              f" -> {'holds' if ok else 'fails'}", file=sys.stderr, flush=True)
        return ok

    good, bad = 0, None
    for level in ladder(min(args.sessions, args.max), args.max):
        if attempt(level):
            good = level
        else:
            bad = level
            break
    if bad is not None:
        while bad - good > args.resolution:
            mid = (good + bad) // 2
            if attempt(mid):
                good = mid
            else:
                bad = mid
    levels = []
    for n in sorted(tried):
        remote = tried[n]["median"]["remote"]
        levels.append({"sessions": n, "holds": holds(tried[n], args.p99_limit),
                       "bash_p50_ms": remote.get("bash.p50_ms"), "bash_p99_ms": remote.get("bash.p99_ms"),
                       "submit_p50_ms": remote.get("submit.p50_ms"), "errors": remote["errors"],
                       "errors_by_kind": remote.get("errors_by_kind", {}),
                       "bash_steps_per_s": remote.get("bash_steps_per_s"),
                       "peak_tree_rss_mib": remote.get("peak_tree_rss_mib"),
                       "mem_available_drop_mib": remote.get("mem_available_drop_mib"),
                       "runs": tried[n]["runs"]})
    return {"max_sessions_holding": good, "first_failing": bad, "capped_at_max": bad is None,
            "p99_limit_s": args.p99_limit, "levels": levels}


def print_capacity(cap: dict[str, Any]) -> None:
    print(f"\ncapacity (bash-step p99 < {cap['p99_limit_s']:g} s, 0 errors; medians per level):")
    print(f"  {'sessions':>8}  {'p50 ms':>9}  {'p99 ms':>9}  {'submit p50':>10}  {'steps/s':>8}  "
          f"{'tree RSS MiB':>12}  {'avail drop MiB':>14}  {'errors':>6}  verdict")
    for lv in cap["levels"]:
        print(f"  {lv['sessions']:>8}  {fmt(lv['bash_p50_ms']):>9}  {fmt(lv['bash_p99_ms']):>9}  "
              f"{fmt(lv['submit_p50_ms']):>10}  {fmt(lv['bash_steps_per_s']):>8}  {fmt(lv['peak_tree_rss_mib']):>12}  "
              f"{fmt(lv['mem_available_drop_mib']):>14}  {lv['errors']:>6}  {'holds' if lv['holds'] else 'fails'}")
    more = " (the --max bound: it may hold more)" if cap["capped_at_max"] else ""
    print(f"  largest concurrency holding: {cap['max_sessions_holding']}{more}")


GRADING_MODES = ("inline", "pool", "elsewhere")


def compare_grading(task_set: TaskSet, args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    """At each of ``--compare-grading`` levels, ``--repeats`` rounds of three modes in a rotating
    order: grading in the server's threads (``inline``, ``--grading-workers 0``), in its grading
    workers (``pool``), and ``elsewhere`` (the pool's server, sessions ending without a submit:
    what steps cost with no grading on this machine, the peer of both)."""
    levels = [int(n) for n in args.compare_grading.split(",")]
    top = max(levels)
    out: dict[str, Any] = {"levels": {}}
    with contextlib.ExitStack() as stack:
        servers = {"inline": stack.enter_context(server_process(top, args.tasks, log_dir / "inline.log", 0)),
                   "pool": stack.enter_context(server_process(top, args.tasks, log_dir / "pool.log",
                                                              args.grading_workers))}
        servers["elsewhere"] = servers["pool"]
        task_ids = args.task or [t["instance_id"] for t in httpx.get(f"{servers['pool'][0]}/v1/tasks",
                                                                      timeout=30).json()]
        if not args.no_warmup:
            for url, pid in {servers["inline"], servers["pool"]}:
                warm = argparse.Namespace(**{**vars(args), "steps": 2, "think": 0.0})
                run_remote(url, pid, task_ids, len(task_ids), warm)
        for n in levels:
            rounds = []
            for r in range(args.repeats):
                order = GRADING_MODES[r % 3:] + GRADING_MODES[:r % 3]
                column: dict[str, Any] = {}
                for mode in order:
                    url, pid = servers[mode]
                    load = round(os.getloadavg()[0], 1)
                    summary = run_remote(url, pid, task_ids, n, args, submit=mode != "elsewhere",
                                         episodes_per_worker=args.episodes).summary()
                    column[mode] = {"bash_p50_ms": summary["bash"].get("p50_ms"),
                                    "bash_p99_ms": summary["bash"].get("p99_ms"),
                                    "submit_p50_ms": summary["submit"].get("p50_ms"),
                                    "submit_p99_ms": summary["submit"].get("p99_ms"), "wall_s": summary["wall_s"],
                                    "errors": summary["errors"], "load_before": load}
                    print(f"  [grading {mode}, {n} sessions, round {r + 1}/{args.repeats}, load {load}] "
                          f"{column[mode]}", file=sys.stderr, flush=True)
                for mode in ("inline", "pool"):
                    base = column["elsewhere"]["bash_p99_ms"]
                    column[f"{mode}_p99_over_elsewhere"] = (round(column[mode]["bash_p99_ms"] / base, 2)
                                                           if base and column[mode]["bash_p99_ms"] else None)
                rounds.append(column)
            medians = {mode: {k: statistics.median(v) if (v := [c[mode][k] for c in rounds
                                                               if c[mode][k] is not None]) else None
                              for k in rounds[0][mode]} for mode in GRADING_MODES}
            for key in ("inline_p99_over_elsewhere", "pool_p99_over_elsewhere"):
                values = [c[key] for c in rounds if c[key] is not None]
                medians[key] = statistics.median(values) if values else None
            out["levels"][n] = {"rounds": rounds, "median": medians}
    return out


def print_grading(result: dict[str, Any]) -> None:
    print("\ngrading on and off the serving path (medians of the rounds; ratio: bash-step p99 over elsewhere's,"
          " the median of each round's ratio):")
    print(f"  {'sessions':>8}  {'mode':>9}  {'bash p50':>9}  {'bash p99':>9}  {'submit p50':>10}  "
          f"{'submit p99':>10}  {'errors':>6}  {'p99 ratio':>9}")
    for n, level in result["levels"].items():
        med = level["median"]
        for mode in GRADING_MODES:
            m = med[mode]
            ratio = med.get(f"{mode}_p99_over_elsewhere", "")
            print(f"  {n:>8}  {mode:>9}  {fmt(m['bash_p50_ms']):>9}  {fmt(m['bash_p99_ms']):>9}  "
                  f"{fmt(m['submit_p50_ms']):>10}  {fmt(m['submit_p99_ms']):>10}  {fmt(m['errors']):>6}  "
                  f"{fmt(ratio) if ratio != '' else '':>9}")


def warm_up(url: str, server_pid: int, task_set: TaskSet, task_ids: list[str], args: argparse.Namespace) -> None:
    """One short session per task, remote and in-process (caches, imports, thread pools); not counted."""
    warm = argparse.Namespace(**{**vars(args), "steps": 2, "think": 0.0})
    width = args.sessions  # the server holds at least this many
    for i in range(0, len(task_ids), width):
        chunk = task_ids[i:i + width]
        for run in (run_remote(url, server_pid, chunk, len(chunk), warm),
                    run_local(task_set, chunk, len(chunk), warm)):
            s = run.summary()
            if s["errors"]:
                raise SystemExit(f"warm-up ({run.mode}) failed: {s['errors_by_kind']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=64, help="concurrent sessions")
    parser.add_argument("--steps", type=int, default=20, help="bash steps per session (then a submit)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement; medians reported")
    parser.add_argument("--think", type=float, default=0.0, help="seconds each session waits before a step")
    parser.add_argument("--episodes", type=int, default=1,
                        help="--compare-grading: sessions each worker runs back to back (more than 1: the steps of "
                             "later sessions overlap the gradings of earlier ones)")
    parser.add_argument("--tasks", help="task file or directory (default: the bundled catalog)")
    parser.add_argument("--task", action="append", help="only this task id (repeatable; default: all, round-robin)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one HTTP request may take")
    parser.add_argument("--no-inprocess", action="store_true", help="skip the in-process peer")
    parser.add_argument("--no-warmup", action="store_true")
    parser.add_argument("--find-max", action="store_true", help="then search the largest concurrency that holds")
    parser.add_argument("--max", type=int, default=512, help="upper bound of --find-max")
    parser.add_argument("--p99-limit", type=float, default=1.0, help="seconds the bash-step p99 must stay under")
    parser.add_argument("--resolution", type=int, default=16, help="bisect until the bracket is this narrow")
    parser.add_argument("--sample-interval", type=float, default=1.0, help="seconds between memory samples")
    parser.add_argument("--grading-workers", type=int, help="the server's --grading-workers (default: serve's)")
    parser.add_argument("--compare-grading", metavar="LEVELS",
                        help="only compare grading inline / in the pool / elsewhere at these concurrencies (16,64,128)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if min(args.sessions, args.steps, args.repeats, args.max, args.resolution) < 1:
        parser.error("--sessions, --steps, --repeats, --max and --resolution must be at least 1")

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # sockets and pipes of hundreds of sessions
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    task_set = load_task_set(args.tasks)
    max_sessions = max(args.sessions, args.max if args.find_max else 0)
    log_path = Path(tempfile.mkdtemp(prefix="pg-bench-server-")) / "server.log"
    if args.compare_grading:
        result = compare_grading(task_set, args, log_path.parent)
        print_grading(result)
        if args.json:
            args.json.write_text(json.dumps(result, indent=2) + "\n")
        return
    results: dict[str, Any] = {"python": sys.version.split()[0], "cpus": os.cpu_count(),
                               "mem_total_mib": round(os.sysconf("SC_PHYS_PAGES") * PAGE / (1 << 20)),
                               "sessions": args.sessions, "steps": args.steps, "repeats": args.repeats,
                               "think_s": args.think, "commands": COMMANDS, "server_max_sessions": max_sessions}
    server_pid = None
    try:
        with server_process(max_sessions, args.tasks, log_path, args.grading_workers) as (url, server_pid):
            task_ids = args.task or [t["instance_id"] for t in httpx.get(f"{url}/v1/tasks", timeout=30).json()]
            results["tasks"] = task_ids
            print(f"server pid {server_pid} at {url} (log {log_path}); {len(task_ids)} tasks", file=sys.stderr)
            if not args.no_warmup:
                warm_up(url, server_pid, task_set, task_ids, args)
            main_result = measure(url, server_pid, task_set, task_ids, args.sessions, args, not args.no_inprocess)
            results["main"] = main_result
            if args.find_max:
                results["capacity"] = find_max(url, server_pid, task_set, task_ids, args, main_result)
            results["server_peak_rss_mib"] = round((status_kb(server_pid, "VmHWM") or 0) / 1024, 1)
    finally:
        if server_pid is not None:
            found = {f"server ({server_pid})": settled_leftovers(server_pid),
                     f"this process ({os.getpid()})": settled_leftovers(os.getpid())}
            left = {who: {k: v for k, v in f.items() if v} for who, f in found.items() if any(f.values())}
            results["leftovers_after_shutdown"] = left
            print("leftovers after shutdown: " + (json.dumps(left) if left else "none"), file=sys.stderr)

    print_table(f"\nserver_load: {args.sessions} sessions x (create + {args.steps} bash + submit + delete), "
                f"{len(results['tasks'])} tasks round-robin, local backend, think {args.think:g} s, "
                f"{args.repeats} run(s)", main_result["runs"], main_result["median"])
    print(f"  server peak RSS (VmHWM, whole bench): {results['server_peak_rss_mib']} MiB")
    if "capacity" in results:
        print_capacity(results["capacity"])
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("interrupted (the server was stopped)", file=sys.stderr)
        sys.exit(130)
