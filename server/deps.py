"""The FastAPI dependencies every protocol's handlers share: the app's :class:`EnvService` and the
caller's identity.

``create_app`` puts the service on ``app.state``; handlers reach it through :data:`Service` rather
than closing over it, so a handler is a module-level function a test can call with a service of its
own. :class:`~starlette.requests.HTTPConnection` is what an HTTP request and a WebSocket share, so
the same dependency serves OpenEnv's ``/ws``.

Dependencies here are ``async``: FastAPI runs a sync dependency in its shared 40-thread pool, a
thread hop per request that queues behind every other pooled call under load.
"""

from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.requests import HTTPConnection

from patchgym.server.core import EnvService

_bearer = HTTPBearer(auto_error=False, description="Required when the server was started with a token.")


def service_of(conn: HTTPConnection) -> EnvService:
    """The service of the app serving ``conn``; also for what cannot take a dependency (an
    exception handler)."""
    return conn.app.state.service


async def current_service(conn: HTTPConnection) -> EnvService:
    """:func:`service_of` as a dependency (async: no thread hop)."""
    return service_of(conn)


Service = Annotated[EnvService, Depends(current_service)]


async def bearer_owner(service: Service, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
                ) -> str | None:
    """The caller's identity from its bearer token (see :meth:`EnvService.authenticate`)."""
    return service.authenticate(creds.credentials if creds is not None else None)


Owner = Annotated[str | None, Depends(bearer_owner)]
