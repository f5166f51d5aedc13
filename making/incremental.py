"""What ``tasks synth`` and ``tasks mine`` need to keep their work when stopped, and to go on later.

* :class:`TaskFile`: the output, appended one task at a time. Each line goes out in a single
  ``write`` on an ``O_APPEND`` descriptor and is flushed to disk before the next, so a killed run
  leaves whole lines; a torn last line (a crash of an older writer, a full disk) is cut off when the
  file is opened again, with a message.
* :class:`Progress`: a small side file (``.<stem>.progress.json``) saying how far an ordered
  search got, replaced atomically. It only saves work: losing it redoes the items after the last
  written task, never changes what is written.
* :class:`Workers`: daemon threads running jobs whose sandboxes are all known, so :meth:`Workers.stop`
  ends the running jobs within seconds (each sandbox closed under it) and joins the threads with a
  deadline *before* the caller removes any scratch space a job may still use.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from patchgym.sandboxes import Sandbox, SandboxError
from patchgym.tasks.backends import SandboxFactory
from patchgym.tasks.model import Task, load_tasks

STOP_TIMEOUT = 20.0  # seconds the workers get to end once stopped
QUIETED = ("patchgym.grading.verifier",)  # its warnings about sandboxes closed by stop() are no news


class TaskFile:
    """A JSONL task file written a line at a time (see the module docstring)."""

    def __init__(self, path: Path, note: Callable[[str], None] = lambda message: None) -> None:
        self.path = path
        self.tasks: list[Task] = []
        if path.exists():
            self._cut_torn_line(note)
            self.tasks = load_tasks(path) if path.stat().st_size else []

    def _cut_torn_line(self, note: Callable[[str], None]) -> None:
        data = self.path.read_bytes()
        keep = len(data)
        if data and not data.endswith(b"\n"):
            keep = data.rfind(b"\n") + 1
        else:
            last = data.rstrip(b"\n").rsplit(b"\n", 1)[-1]
            try:
                if last.strip():
                    json.loads(last)
            except ValueError:
                keep = len(data.rstrip(b"\n")) - len(last)
        if keep < len(data):
            note(f"{self.path.name}: dropped a torn last line ({len(data) - keep} bytes) left by an interrupted run")
            with open(self.path, "r+b") as f:
                f.truncate(keep)
                os.fsync(f.fileno())

    def append(self, task: Task) -> None:
        line = (json.dumps(task.to_row(), ensure_ascii=False) + "\n").encode("utf-8")
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            written = os.write(fd, line)
            if written != len(line):  # a regular file takes it whole, short of a full disk
                raise OSError(f"short write to {self.path} ({written} of {len(line)} bytes)")
            os.fsync(fd)
        finally:
            os.close(fd)
        self.tasks.append(task)

    def create(self) -> None:
        """The file exists (empty when nothing is written yet), so a run that makes no task says so."""
        os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644))


class Progress:
    """How far an ordered search got: ``next`` for the run described by ``key``."""

    def __init__(self, output: Path, key: dict[str, Any]) -> None:
        self.path = output.with_name(f".{output.stem}.progress.json")
        self.key = key

    def _saved(self) -> dict[str, Any] | None:
        try:
            saved = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return saved if isinstance(saved, dict) and saved.get("key") == self.key else None

    def matches(self) -> bool:
        """Whether the side file is this run's (same key)."""
        return self._saved() is not None

    def read(self) -> int:
        saved = self._saved()
        return int(saved.get("next", 0)) if saved else 0

    def notes(self) -> dict[str, Any]:
        """What the run kept beside its position (e.g. why items were dropped)."""
        saved = self._saved()
        return dict(saved.get("notes") or {}) if saved else {}

    def write(self, next_index: int, notes: dict[str, Any] | None = None) -> None:
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"key": self.key, "next": next_index, "notes": notes or {}}))
        tmp.replace(self.path)


class Workers:
    """``count`` daemon threads running submitted jobs; their results come back through :meth:`results`.

    Jobs make sandboxes through :attr:`factory`, which remembers them: :meth:`stop` closes every one
    still open (a command running in it returns at once) until the threads have ended.
    """

    def __init__(self, count: int, factory: SandboxFactory) -> None:
        self._factory = factory
        self._open: weakref.WeakSet[Sandbox] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._jobs: queue.Queue[tuple[Any, Callable[[], Any]] | None] = queue.Queue()
        self._done: queue.Queue[tuple[Any, Any, BaseException | None]] = queue.Queue()
        self.stopped = threading.Event()
        self.in_flight = 0
        self._threads = [threading.Thread(target=self._loop, name=f"patchgym-worker-{i}", daemon=True)
                         for i in range(max(1, count))]
        for thread in self._threads:
            thread.start()
        for name in QUIETED:
            logging.getLogger(name).addFilter(self._quiet)

    def _quiet(self, record: logging.LogRecord) -> bool:
        return not (self.stopped.is_set() and threading.current_thread() in self._threads)

    def factory(self, task: Task) -> Sandbox:
        if self.stopped.is_set():
            raise SandboxError("stopped")
        sandbox = self._factory(task)
        with self._lock:
            self._open.add(sandbox)
        if self.stopped.is_set():  # stop() ran while it was being made
            sandbox.close()
            raise SandboxError("stopped")
        return sandbox

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            key, fn = job
            if self.stopped.is_set():
                continue
            try:
                result, error = fn(), None
            except BaseException as exc:  # handed to the caller
                result, error = None, exc
            self._done.put((key, result, error))

    def submit(self, key: Any, fn: Callable[[], Any]) -> None:
        self.in_flight += 1
        self._jobs.put((key, fn))

    def results(self, timeout: float = 0.5) -> list[tuple[Any, Any, BaseException | None]]:
        """The jobs finished since the last call (waiting up to ``timeout`` for the first one)."""
        found = []
        with contextlib.suppress(queue.Empty):
            found.append(self._done.get(timeout=timeout))
            while True:
                found.append(self._done.get_nowait())
        self.in_flight -= len(found)
        return found

    def stop(self, timeout: float = STOP_TIMEOUT) -> bool:
        """End the jobs and join the threads, within ``timeout`` seconds; True when all ended."""
        self.stopped.set()
        for _ in self._threads:
            self._jobs.put(None)
        deadline = time.monotonic() + timeout
        while any(t.is_alive() for t in self._threads) and time.monotonic() < deadline:
            with self._lock:
                sandboxes = list(self._open)
            for sandbox in sandboxes:
                with contextlib.suppress(Exception):
                    sandbox.close()
            for thread in self._threads:
                thread.join(timeout=0.2)
        ended = not any(t.is_alive() for t in self._threads)
        if ended:
            for name in QUIETED:
                logging.getLogger(name).removeFilter(self._quiet)
        return ended
