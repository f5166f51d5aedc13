"""A network namespace that has only loopback, for tests whose tools listen on every interface
(Ray, NeMo Gym): nothing they open is reachable from outside the machine."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time


class Netns:
    """A network namespace with only ``lo``; on close every process in it is killed, then it goes."""

    def __init__(self, prefix: str = "pg") -> None:
        self.name = f"{prefix}-{secrets.token_hex(4)}"

    def __enter__(self) -> Netns:
        subprocess.run(["ip", "netns", "add", self.name], check=True, capture_output=True)
        try:
            subprocess.run(["ip", "netns", "exec", self.name, "ip", "link", "set", "lo", "up"], check=True,
                           capture_output=True)
        except BaseException:
            subprocess.run(["ip", "netns", "delete", self.name], capture_output=True)
            raise
        return self

    def argv(self, argv: list[str]) -> list[str]:
        """``argv`` run in the namespace by ``ip netns exec`` (which also mounts a fresh /sys)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def enter(self, argv: list[str]) -> list[str]:
        """``argv`` run in the namespace with the host's mounts kept (``/sys/fs/cgroup`` included,
        which ``ip netns exec``'s fresh /sys hides: sandboxes there would have no cgroups)."""
        return ["nsenter", f"--net=/run/netns/{self.name}", "--", *argv]

    def pids(self) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.name], capture_output=True, text=True).stdout
        return [int(p) for p in out.split() if p.isdigit() and int(p) != os.getpid()]

    def kill_all(self, grace: float = 5.0) -> None:
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and self.pids():
                time.sleep(0.2)

    def __exit__(self, *exc) -> None:
        try:
            self.kill_all()
        finally:
            subprocess.run(["ip", "netns", "delete", self.name], capture_output=True)
