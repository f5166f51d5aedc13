"""The guard of one sandbox host (see :func:`.host.start_guard`): ``python -m patchgym.sandboxes.ray_cluster.guard``.

It detaches (a second fork, so that it is nobody's child and a worker's exit, which kills the
worker's children, leaves it alone), reads its standard input until end of file, which comes when
the host process is gone, waits until that process is fully dead, and then removes what dead
owners left on this node: cgroups first (their processes die), then directories and mounts, then
patchgym's containers when a Docker engine is reachable.
"""

from __future__ import annotations

import os
import sys
import time

WAIT_FOR_EXIT = 60.0


def main() -> None:
    if os.fork():
        os._exit(0)  # the parent leaves at once: the guard is reparented away from the worker
    while os.read(0, 4096):
        pass
    writer = int(os.environ.get("PATCHGYM_GUARD_WRITER", "0") or 0)
    from patchgym.sandboxes.reaper import is_alive

    deadline = time.monotonic() + WAIT_FOR_EXIT
    while writer and is_alive(writer) and time.monotonic() < deadline:
        time.sleep(0.1)  # a zombie still counts as alive to the reaper: wait until it is reaped
    from patchgym.sandboxes.cleanup import reap_stale

    reap_stale()
    try:
        from patchgym.sandboxes.docker import docker_available, gc_containers

        if docker_available():
            gc_containers()
    except Exception:  # no docker client or engine: nothing of docker's to clean
        pass


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # a guard has nobody to report to but its node's log
        print(f"patchgym guard: {exc}", file=sys.stderr)
