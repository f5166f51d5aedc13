"""Run an app on a real uvicorn server for the tests (the server tests never use a test client:
threads, deadlines and disconnects behave only as they do on a real server), configured as
``patchgym serve`` runs it (:mod:`patchgym.server.serving`: guarded connections, the deeper queue)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import uvicorn

from patchgym.server.serving import Server, server_config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, alive: Callable[[], bool], *, timeout: float = 30,
                 why: Callable[[], str] = lambda: "") -> None:
    """Wait until ``url``'s /healthz answers 200; fail when ``alive()`` turns false or time runs out
    (with ``why()``, e.g. the server's log)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or not alive():
            raise RuntimeError(f"the server at {url} did not start\n{why()}")
        time.sleep(0.05)


@contextlib.contextmanager
def serve(app, **options) -> Iterator[str]:
    """Run ``app`` on a real uvicorn server on a free loopback port, in a background thread
    (``options``: :func:`patchgym.server.serving.server_config`'s for patchgym's app, uvicorn's for
    any other)."""
    port = free_port()
    if getattr(app.state, "service", None) is None:  # not patchgym's app (a scripted model endpoint): plain uvicorn
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on", **options)
    else:
        config = server_config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on", **options)
    srv = Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, thread.is_alive)
    try:
        yield url
    finally:
        srv.should_exit = True
        thread.join(timeout=30)


