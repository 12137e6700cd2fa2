"""The stream's exceptions: each message names the file, shard or field and what was expected."""
from __future__ import annotations


class StreamError(Exception):
    """Base class of every error raised by `stream`."""


class ConfigError(StreamError, ValueError):
    """A configuration value is out of range; the message names the field and the allowed values."""


class IntegrityError(StreamError):
    """A file does not match its manifest: names the file and both digests (expected, actual)."""

    def __init__(self, what: str, path: str, expected: str, actual: str, detail: str = "") -> None:
        self.what, self.path, self.expected, self.actual = what, path, expected, actual
        msg = f"{what} {path!s} does not match the manifest: expected blake3 {expected}, actual {actual}"
        super().__init__(msg + (f" ({detail})" if detail else ""))


class StateError(StreamError):
    """A saved stream state does not belong to this stream (other corpus, seed or seq_len) or is malformed."""
