"""HTTP server for remote trainers: ``server.create_app`` (FastAPI), ``server.client.RemoteEnv``
and, for batched rollouts, ``server.async_client.AsyncClient`` (also ``server.AsyncClient``).

Importing this package registers ``patchgym/Remote-v0`` with Gymnasium
(``gym.make("patchgym/Remote-v0", url=..., token=None)``). The app and the async client are
imported lazily, so a trainer needs only the dependencies of the client it uses.
"""

from typing import Any

import gymnasium

# nondeterministic: the remote environment runs real test suites, like RepoEnv.
if "patchgym/Remote-v0" not in gymnasium.registry:
    gymnasium.register(id="patchgym/Remote-v0", entry_point="server.client:RemoteEnv", nondeterministic=True)

_LAZY = {"create_app": "server.app", "AsyncClient": "server.async_client", "run_many": "server.async_client",
         "RetriesExhausted": "server.async_client", "RemoteEnv": "server.client", "RemoteEnvError": "server.client"}


def __getattr__(name: str) -> Any:
    """``server.AsyncClient`` and friends, imported on first use (PEP 562)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'server' has no attribute {name!r}")
