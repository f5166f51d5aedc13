"""Capping command output: keep the head and the tail, drop the middle, say so visibly."""

from __future__ import annotations

DEFAULT_OUTPUT_LIMIT = 1 << 20  # 1 MiB of text back per command


class CappedOutput:
    """Accumulates a byte stream but keeps at most ``limit`` bytes: the first half and the last half.

    Memory stays bounded whatever the command prints (a test that prints 100 MB costs ``limit``
    bytes), and the marker tells a reader (a model, a person) how much was left out.
    """

    def __init__(self, limit: int = DEFAULT_OUTPUT_LIMIT) -> None:
        if limit < 2:
            raise ValueError("output limit must be at least 2 bytes")
        self.limit = limit
        self._head_limit = limit // 2
        self._tail_limit = limit - self._head_limit
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self._head_limit - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self._tail += chunk
            if len(self._tail) > self._tail_limit:
                del self._tail[: len(self._tail) - self._tail_limit]

    def parts(self) -> tuple[bytes, bytes]:
        """The head and the tail kept, as bytes (what a command server sends back)."""
        return bytes(self._head), bytes(self._tail)

    @property
    def truncated(self) -> bool:
        return self.total > len(self._head) + len(self._tail)

    def text(self) -> str:
        head = self._head.decode("utf-8", errors="replace")
        tail = self._tail.decode("utf-8", errors="replace")
        if not self.truncated:
            return head + tail
        dropped = self.total - len(self._head) - len(self._tail)
        return f"{head}\n[... output truncated: {dropped} bytes omitted of {self.total} ...]\n{tail}"
