"""JSON lines off a non-blocking socket, bounded: no line may exceed a size, and no more than one
line's limit plus one chunk is ever held."""

from __future__ import annotations


class LineTooLong(ValueError):
    pass


class LineBuffer:
    """Newline-terminated lines of bytes fed as they are read, holding at most one line's limit
    plus one chunk: the reader of a non-blocking socket."""

    def __init__(self, max_line_bytes: int):
        self._limit = max_line_bytes
        self._buffer = bytearray()
        self.received = 0  # bytes fed in all

    def feed(self, chunk: bytes) -> list[bytes]:
        """The complete lines `chunk` ends (without their newlines); LineTooLong beyond the limit."""
        self.received += len(chunk)
        self._buffer += chunk
        if b"\n" not in chunk:
            if len(self._buffer) > self._limit:
                raise LineTooLong(f"a line longer than {self._limit} bytes")
            return []
        lines = self._buffer.split(b"\n")
        self._buffer = bytearray(lines.pop())
        for line in lines:
            if len(line) > self._limit:
                raise LineTooLong(f"a line longer than {self._limit} bytes")
        if len(self._buffer) > self._limit:
            raise LineTooLong(f"a line longer than {self._limit} bytes")
        return [bytes(line) for line in lines]
