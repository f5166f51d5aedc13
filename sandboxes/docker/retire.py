"""Containers let go of: their stream closed, then seen gone by one daemon thread.

A sandbox or build container is started with ``auto_remove`` and tied to its client's attached
stream (:func:`.connection.attach`): closing the stream ends its main process, and the engine
removes it. Removing it as well from here raced that removal (the engine logs ``removal of
container ... is already in progress`` for each, and a storm of closes became a storm of
conflicting removals under per-container locks). So a container let go of is only *watched*: one
thread lists this process's containers (one request per round, whatever their number) until each
is gone, and force-removes only one still there :data:`GRACE` seconds after it was let go of (a
main process that could not read its stream) or never started.

Nothing here keeps a process alive: the thread is a daemon, and at exit the process waits at most
:data:`EXIT_WAIT` seconds for the engine to finish; what is still there is named in a warning with
its state, for ``patchgym sandboxes gc`` (its owner is gone by then).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time

from patchgym.sandboxes.docker.client import OWNER_LABEL, docker_client, owner_id, remove_container

log = logging.getLogger(__name__)

GRACE = 10.0  # seconds the engine is given to remove a container whose main process ended
GIVE_UP = 300.0  # seconds after which a container is left to gc (an engine not answering)
POLL = 0.2
EXIT_WAIT = 5.0


class Retirements:
    """Containers let go of and not yet seen gone."""

    def __init__(self) -> None:
        self._pending: dict[str, tuple[object, float, str]] = {}  # id -> (container, since, last state)
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def retire(self, container, connection=None) -> None:
        """Let go of ``container``: close its stream (its main process ends, the engine removes
        it) and watch it until it is gone. Returns at once."""
        if connection is not None:
            connection.close()
        with self._changed:
            self._pending[container.id] = (container, time.monotonic(), "")
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="patchgym-docker-retire", daemon=True)
                self._thread.start()

    def wait(self, timeout: float, ids: set[str] | None = None) -> list[str]:
        """Wait at most ``timeout`` seconds until the containers ``ids`` (default: all let go of)
        are gone; return lines naming those still there."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                left = [i for i in self._pending if ids is None or i in ids]
                remaining = deadline - time.monotonic()
                if not left or remaining <= 0:
                    return [f"{i[:12]} ({self._pending[i][2] or 'not yet seen'})" for i in left]
                self._changed.wait(remaining)

    def _watch(self) -> None:
        while True:
            time.sleep(POLL)
            with self._changed:
                if not self._pending:
                    self._thread = None
                    self._changed.notify_all()
                    return
            try:  # sparse: the listing's own fields, no inspection per container
                found = docker_client().containers.list(all=True, sparse=True,
                                                        filters={"label": f"{OWNER_LABEL}={owner_id()}"})
                states = {c.id: c.attrs.get("State", "") for c in found}
            except Exception as exc:  # the engine is busy or gone: try again next round
                log.debug("cannot list containers: %s", exc)
                states = None
            now = time.monotonic()
            overdue = []
            with self._changed:
                for cid, (container, since, _) in list(self._pending.items()):
                    if states is not None and cid not in states:
                        del self._pending[cid]  # gone
                    elif now - since > GIVE_UP:
                        del self._pending[cid]
                        log.warning("container %s was not removed %.0fs after it was let go of; "
                                    "`patchgym sandboxes gc` removes it", cid[:12], GIVE_UP)
                    elif states is not None:
                        state = states[cid]
                        self._pending[cid] = (container, since, state)
                        # "removing": the engine is at it; anything else past the grace is stuck
                        if now - since > GRACE and state != "removing":
                            overdue.append(cid)
                self._changed.notify_all()
            for cid in overdue:
                container = self._pending.get(cid, (None,))[0]
                if container is not None:
                    remove_container(container)  # warns, for gc, when it cannot
                with self._changed:
                    self._pending.pop(cid, None)
                    self._changed.notify_all()


retirements = Retirements()


def _at_exit() -> None:
    left = retirements.wait(EXIT_WAIT)
    if left:
        log.warning("%d container(s) let go of were not removed by the engine within %.0fs of exit: %s; "
                    "`patchgym sandboxes gc` removes them", len(left), EXIT_WAIT, ", ".join(left))


atexit.register(_at_exit)
