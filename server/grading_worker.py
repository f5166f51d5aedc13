"""A grading worker of :mod:`patchgym.server.grading_pool`: reads its configuration, joins the
grading cgroup, then grades one request at a time until its stdin closes.

    python -m patchgym.server.grading_worker

Frames on stdin and stdout: an 8-byte big-endian size, then a pickle (the server is this
process's parent: nothing else writes here). The first frame is the configuration; each next one
is ``(task, patch, run_empty)``, answered with ``(True, report)`` or ``(False, exception)``.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path
from typing import Any, BinaryIO


def read_frame(stream: BinaryIO) -> Any | None:
    size = stream.read(8)
    if len(size) < 8:
        return None
    return pickle.loads(stream.read(int.from_bytes(size, "big")))


def main() -> None:
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing printed by what runs here may break the frames
    config = read_frame(stdin)
    if config is None:
        return
    if config["group"]:
        try:
            Path(config["group"], "cgroup.procs").write_text("0")  # this process; what it starts follows
        except OSError as exc:
            print(f"patchgym grading worker: cannot join {config['group']}: {exc}", file=sys.stderr)
    from patchgym.grading.verifier import Verifier
    from patchgym.tasks.backends import sandbox_factory

    verifier = Verifier(sandbox_factory(config["backend"], **config["sandbox_options"]),
                        partial_credit=config["partial_credit"], prices=config["prices"],
                        tampering_reward=config["tampering_reward"])
    while (request := read_frame(stdin)) is not None:
        task, patch, run_empty = request
        try:
            answer: tuple[bool, Any] = (True, verifier.verify(task, patch, run_empty=run_empty))
        except Exception as exc:  # handed to the server's caller
            answer = (False, exc)
        data = pickle.dumps(answer)
        stdout.write(len(data).to_bytes(8, "big") + data)
        stdout.flush()


if __name__ == "__main__":
    main()
