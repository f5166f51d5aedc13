"""HTTP server for remote trainers: ``server.app.create_app`` (FastAPI) and ``server.client.RemoteEnv``.

Importing this package registers ``patchgym/Remote-v0`` with Gymnasium
(``gym.make("patchgym/Remote-v0", url=..., token=None)``). The app itself is imported lazily, so
a trainer needs only the client's dependencies.
"""

import gymnasium

# nondeterministic: the remote environment runs real test suites, like RepoEnv.
if "patchgym/Remote-v0" not in gymnasium.registry:
    gymnasium.register(id="patchgym/Remote-v0", entry_point="server.client:RemoteEnv", nondeterministic=True)
