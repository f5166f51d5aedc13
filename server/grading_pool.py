"""Grading off the serving path: a submit is graded by worker processes with a CPU share of their
own, so that the steps of other sessions stay fast while episodes are graded.

Grading is most of an episode's CPU (its test runs), and in the server's own threads it also held
the server's interpreter lock (patch parsing, reading results). Here it runs in ``workers``
processes (``python -m patchgym.server.grading_worker``). Where this process may make cgroups of
the ``cpu`` controller (root, v1 ``cpu.shares`` or v2 ``cpu.weight``), two siblings split the
cores: the server itself joins ``patchgym-serving-<pid>`` (its event loop, and the sandboxes of
the steps, which inherit it), the workers ``patchgym-grading-<pid>``, weighted 1024 against
``cpu_share``: when both want the cores, grading gets ``cpu_share / (1024 + cpu_share)`` of them
(the default 1024: half), and all of them when the serving side idles. Both are weighted by the
number of cores against the host's other processes, so the server is not squeezed into one
process's share. Without such cgroups the pool still takes grading out of the server's process
(and its interpreter lock), and a warning says so.

Workers end with the server: SIGTERM from :meth:`GradingPool.close` (the server's lifespan end),
or as their death signal when the server is killed (:func:`patchgym.sandboxes.lifetime.spawn`).
Either way a worker abandons the grading under way and closes the sandbox it grades in before it
ends (:mod:`.grading_worker`); one still there after :data:`CLOSE_WAIT` is SIGKILLed. A worker that
dies is replaced at the next call; the grading it had fails with :class:`GradingWorkerError`, an
infrastructure error. The cgroups are removed when the pool closes; what a killed server left is
removed by the next pool.
"""

from __future__ import annotations

import atexit
import logging
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from patchgym.grading.cost import Prices
from patchgym.grading.verifier import InstanceReport
from patchgym.sandboxes.base import SandboxError
from patchgym.sandboxes.lifetime import spawn
from patchgym.sandboxes.reaper import is_alive
from patchgym.server.grading_worker import EXIT_DEADLINE
from patchgym.tasks.model import Task

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
PREFIXES = ("patchgym-serving-", "patchgym-grading-")
# Equal to the serving side's: half of contended cores, all of idle ones. A fifth (256) made submits 2-15x slower
# than inline grading on a saturated host (bench/README.md): rewards matter to a trainer as much as steps.
DEFAULT_CPU_SHARE = 1024
# A worker told to stop closes the sandbox it grades in within its own deadline; then it is SIGKILLed.
CLOSE_WAIT = EXIT_DEADLINE + 5.0
STOP_WAIT = 5.0  # for one worker, not the pool: after its failure, or after SIGKILL
_returning_to: Path | None = None  # the cgroup this process leaves for the serving one


class GradingWorkerError(SandboxError):
    """A grading worker died or answered nonsense, or the pool closed (the server's failure, not
    the agent's): an infrastructure failure, as a server answers a :class:`SandboxError` (503)."""


def cpu_groups(share: int) -> tuple[Path, Path] | None:
    """New sibling cgroups of the ``cpu`` controller for this process (serving) and its grading
    workers, weighted 1024 and ``share`` times the number of cores (v1 shares; v2 weights scaled);
    None where they cannot be made here. This process joins the serving one."""
    v1 = CGROUP_ROOT / "cpu"
    base, knob, scale = (v1, "cpu.shares", 1.0) if (v1 / "cpu.shares").exists() else (
        CGROUP_ROOT, "cpu.weight", 100 / 1024)
    if not (base / "cgroup.procs").exists():
        return None
    for prefix in PREFIXES:
        for stale in base.glob(f"{prefix}*"):  # a killed server's
            pid = stale.name.removeprefix(prefix)
            if pid.isdigit() and not is_alive(int(pid)):
                _remove(stale)
    cores = os.cpu_count() or 1
    made = []
    global _returning_to
    current = _current_group(base)
    if not current.name.startswith(PREFIXES[0]):  # a second pool of this process keeps the first's
        _returning_to = current
    try:
        for prefix, weight in zip(PREFIXES, (1024, share), strict=True):
            group = base / f"{prefix}{os.getpid()}"
            group.mkdir(exist_ok=True)
            made.append(group)
            (group / knob).write_text(str(max(2, min(262144, int(weight * cores * scale)))))
        (made[0] / "cgroup.procs").write_text(str(os.getpid()))  # with every thread
    except OSError as exc:
        log.warning("grading runs without a CPU share of its own (cgroups of the cpu controller: %s)", exc)
        for group in made:
            _remove(group)
        return None
    return made[0], made[1]


def _current_group(base: Path) -> Path:
    """This process's cgroup of the hierarchy mounted at ``base`` (v1 ``cpu``, or v2's)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (base.name == "cpu" and "cpu" in controllers.split(",")) or (base == CGROUP_ROOT and not controllers):
            return base / path.lstrip("/")
    return base


def _remove(group: Path) -> None:
    try:
        group.rmdir()  # only an empty cgroup goes; one with live processes stays until they end
    except OSError:
        pass


class _Worker:
    """One ``grading_worker`` process: a pickled request in, a pickled answer out (both trusted:
    this server's own child)."""

    def __init__(self, config: dict[str, Any]) -> None:
        # A death signal it answers by closing the sandbox it grades in, as it answers close().
        self.proc = spawn([sys.executable, "-m", "patchgym.server.grading_worker"], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, death_signal="TERM")
        self._send(config)

    def _send(self, value: Any) -> None:
        assert self.proc.stdin is not None
        data = pickle.dumps(value)
        self.proc.stdin.write(len(data).to_bytes(8, "big") + data)
        self.proc.stdin.flush()

    def call(self, *request: Any) -> Any:
        try:
            self._send(request)
            assert self.proc.stdout is not None
            size = self.proc.stdout.read(8)
            data = self.proc.stdout.read(int.from_bytes(size, "big")) if len(size) == 8 else b""
            ok, value = pickle.loads(data)
        except Exception as exc:  # a pipe closed by a dead worker, a short read
            raise GradingWorkerError(f"a grading worker died (exit {self.proc.poll()}): {exc}") from None
        if not ok:
            raise value
        return value

    def terminate(self) -> None:
        """Ask the process to end: SIGTERM, which abandons a grading under way and closes its
        sandbox (:mod:`.grading_worker`)."""
        self._close_stdin()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def _close_stdin(self) -> None:
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
        except OSError:  # a pipe the worker closed first, with a request not yet flushed
            pass

    def reap(self, deadline: float) -> None:
        """Wait for the process until ``deadline`` (monotonic), then SIGKILL it: never longer."""
        try:
            self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("grading worker %d did not end in time after SIGTERM: killed", self.proc.pid)
            self.proc.kill()
            try:
                self.proc.wait(timeout=STOP_WAIT)
            except subprocess.TimeoutExpired:  # unkillable (a hung mount): not waited for
                log.error("grading worker %d survives SIGKILL", self.proc.pid)

    def close(self) -> None:
        """End the process and close its answers' pipe: only from the thread that reads it, or
        while none does (a close waits for a read under way). At its stdin's end an idle worker
        ends, and one whose answer failed is most likely ending already (exit handlers after its
        answers' pipe closed): a SIGTERM then would cut those short, so it comes only later."""
        self._close_stdin()
        try:
            self.proc.wait(timeout=STOP_WAIT)
        except subprocess.TimeoutExpired:
            self.terminate()
            self.reap(time.monotonic() + STOP_WAIT)
        try:
            self.proc.stdout.close()  # type: ignore[union-attr]
        except OSError:
            pass


class GradingPool:
    """A :class:`~patchgym.grading.verifier.Verifier` stand-in (``verify``) that grades in worker
    processes, at most ``workers`` at once (more calls wait for a free one); thread-safe."""

    def __init__(self, workers: int, *, backend: str, sandbox_options: dict[str, Any] | None = None,
                 partial_credit: bool = False, prices: Prices | None = None,
                 cpu_share: int = DEFAULT_CPU_SHARE, tampering_reward: float = 0.0) -> None:
        if workers < 1:
            raise ValueError("a grading pool needs at least one worker")
        groups = cpu_groups(cpu_share)
        self.group = groups[1] if groups else None
        self._config = {"group": str(self.group) if self.group else None, "backend": backend,
                        "sandbox_options": dict(sandbox_options or {}), "partial_credit": partial_credit,
                        "prices": prices or Prices(), "tampering_reward": tampering_reward}
        # Idle workers; None once closed (each waiter that takes it puts it back for the next).
        self._idle: queue.SimpleQueue[_Worker | None] = queue.SimpleQueue()
        self._all: list[_Worker] = []
        self._lock = threading.Lock()
        self._closed = False
        for _ in range(workers):
            self._add()
        atexit.register(self.close)

    def _take_idle(self) -> _Worker | None:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            return None

    def _add(self) -> None:
        worker = _Worker(self._config)
        with self._lock:
            if not self._closed:
                self._all.append(worker)
                self._idle.put(worker)
                return
        worker.close()  # the pool closed while it started

    def verify(self, task: Task, patch: str, *, run_empty: bool = False) -> InstanceReport:
        """Grade ``patch`` in a worker (blocks the calling thread, not the server's cores). Raises
        :class:`GradingWorkerError` when the worker dies under it (the pool closing, a kill) or the
        pool is closed."""
        worker = self._idle.get()
        if worker is None:
            self._idle.put(None)
            raise GradingWorkerError("the grading pool is closed")
        try:
            report = worker.call(task, patch, run_empty)
        except GradingWorkerError:
            self._drop(worker)
            raise
        with self._lock:
            if not self._closed:
                self._idle.put(worker)
                return report
        worker.close()  # closed under this grading: its answer still counts
        return report

    def _drop(self, worker: _Worker) -> None:
        """A worker that failed goes; a new one takes its place while the pool is open."""
        with self._lock:
            if worker in self._all:
                self._all.remove(worker)
        worker.close()
        if not self._closed:
            self._add()  # the pool stays whole; this grading failed

    def close(self) -> None:
        """End every worker (SIGTERM, then SIGKILL past :data:`CLOSE_WAIT`; never longer) and
        remove the cgroups. A grading under way fails with :class:`GradingWorkerError` in its
        caller, whose thread closes that worker's pipe."""
        with self._lock:
            self._closed, workers, self._all = True, self._all, []
        idle = []
        while (worker := self._take_idle()) is not None:
            idle.append(worker)
        self._idle.put(None)  # wakes, and fails, every call waiting for a worker
        for worker in workers:
            worker.terminate()
        deadline = time.monotonic() + CLOSE_WAIT
        for worker in workers:
            worker.reap(deadline)
        for worker in idle:
            worker.close()
        if self.group is not None:
            _remove(self.group)
            serving = self.group.with_name(self.group.name.replace(PREFIXES[1], PREFIXES[0]))
            if _returning_to is not None and serving.is_dir():
                try:  # back where this process was, so that the serving group can go
                    (_returning_to / "cgroup.procs").write_text(str(os.getpid()))
                except OSError as exc:
                    log.debug("cannot leave %s: %s", serving, exc)
                _remove(serving)
