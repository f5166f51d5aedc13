"""The gate every HTTP request passes before anything else runs for it: the token, then the size of
its body, checked on its headers alone.

FastAPI reads and parses a request's body before it resolves the dependency that checks the
token, so without the gate anyone who can reach the server could make it read and hold a large
body (or queue behind a slow one) with no token at all. With the server's tokens set, a request
for any path but the public ones (:data:`PUBLIC_PATHS`: probes, metrics and schemas, which show
aggregates only and no tenant's data) is answered 401 here when it carries no valid token. Then a
body larger than ``max_body`` bytes is 413, and one of unknown length (chunked) 411: no client
of the API sends one, and its size could not be bounded before reading it. The routes still ask
for the token themselves (the owner of a session is its digest); the gate only makes sure that
nothing is done for a request that will be refused.

WebSockets (OpenEnv's ``/ws``) check the token before accepting, in their route.
"""

from __future__ import annotations

import base64
import binascii
import json

from fastapi import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from patchgym.server.core import EnvService

# Answer without a token: health probes, Prometheus metrics, the API's schemas and docs, and
# OpenEnv's stateless /state (which shows a tenant its limits only when it sends its token).
PUBLIC_PATHS = frozenset({"/healthz", "/health", "/metrics", "/schema", "/state", "/openapi.json", "/docs",
                          "/docs/oauth2-redirect", "/redoc"})
MAX_BODY = 64 << 20  # the grader reads no patch larger (grading.patches.MAX_PATCH_BYTES)


def presented_token(authorization: str | None) -> str | None:
    """The token a request presents: ``Bearer TOKEN``, or HTTP Basic with the token as password
    (what NeMo Gym's clients send for ``user:TOKEN@host`` URLs); None for none or another scheme."""
    scheme, _, credentials = (authorization or "").strip().partition(" ")
    credentials = credentials.strip()
    if scheme.lower() == "bearer":
        return credentials or None
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(credentials, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None
        return decoded.partition(":")[2] or None
    return None


class TokenGate:
    """ASGI middleware: refuse, on its headers alone, a request without a valid token (401) or with
    a body that is too large (413) or of unknown length (411)."""

    def __init__(self, app: ASGIApp, service: EnvService, max_body: int = MAX_BODY) -> None:
        self.app = app
        self.service = service
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self.refusal(scope)
            if refusal is not None:
                await _answer(send, *refusal)
                return
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope) -> tuple[int, str, list[tuple[bytes, bytes]]] | None:
        """Why ``scope`` is refused (status, detail, extra headers; counted in the metrics), or None."""
        headers = dict(scope["headers"])  # lower-case names; a repeated header: the last one
        if self.service.tokens and scope["path"] not in PUBLIC_PATHS:
            authorization = headers.get(b"authorization", b"").decode("latin-1")
            try:
                self.service.authenticate(presented_token(authorization))
            except HTTPException as exc:  # counted by authenticate
                return 401, str(exc.detail), [(b"www-authenticate", b"Bearer")]
        if b"transfer-encoding" in headers:
            self.service.metrics.errors.labels("validation").inc()
            return 411, "send the body with a Content-Length (chunked bodies are refused)", []
        length = headers.get(b"content-length", b"0")
        if not length.isdigit() or int(length) > self.max_body:
            self.service.metrics.errors.labels("validation").inc()
            return 413, f"the body is larger than {self.max_body} bytes", []
        return None


async def _answer(send: Send, status: int, detail: str, headers: list[tuple[bytes, bytes]]) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"), *headers]})
    await send({"type": "http.response.body", "body": body})
