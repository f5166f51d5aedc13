"""HTTP server for remote trainers: ``patchgym.server.create_app`` (FastAPI), ``RemoteEnv`` (the
``RepoEnv`` API over HTTP) and, for batched rollouts, ``AsyncClient``.

Importing this package registers ``patchgym/Remote-v0`` with Gymnasium
(``gym.make("patchgym/Remote-v0", url=..., token=None)``; with no import,
``gym.make("patchgym.server:patchgym/Remote-v0", url=...)``). The app and the clients are imported
lazily, so a trainer needs only the dependencies of the client it uses.
"""

from typing import Any

import gymnasium

# nondeterministic: the remote environment runs real test suites, like RepoEnv.
if "patchgym/Remote-v0" not in gymnasium.registry:
    gymnasium.register(id="patchgym/Remote-v0", entry_point="patchgym.server.client:RemoteEnv", nondeterministic=True)

_LAZY = {"create_app": "patchgym.server.app", "AsyncClient": "patchgym.server.async_client",
         "run_many": "patchgym.server.async_client", "RetriesExhausted": "patchgym.server.async_client",
         "RemoteEnv": "patchgym.server.client", "RemoteEnvError": "patchgym.server.client"}


def __getattr__(name: str) -> Any:
    """``patchgym.server.AsyncClient`` and friends, imported on first use (PEP 562)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'patchgym.server' has no attribute {name!r}")
