"""The app's exceptions: each message names the file, tensor or field and what was expected."""
from __future__ import annotations

from stream.errors import StreamError


class AppError(Exception):
    """Base class of every error raised by `app` (training's, replay's and quant's errors derive from it)."""


class ConfigError(AppError, ValueError):
    """A configuration value is out of range: names the field and the allowed values."""


class IntegrityError(AppError):
    """A file does not match its recorded digest: names the file and both digests."""

    def __init__(self, path: str, expected: str, actual: str, detail: str = "") -> None:
        self.path, self.expected, self.actual = str(path), expected, actual
        msg = f"{path}: blake3 mismatch: expected {expected}, actual {actual}"
        super().__init__(msg + (f" ({detail})" if detail else ""))


class CheckpointError(AppError):
    """A checkpoint is malformed, unsafe (e.g. a pickle payload) or does not fit this run."""


class RunDirError(AppError):
    """A run directory exists where a new run would start (or is missing where a resume needs it)."""


class DivergenceError(AppError):
    """A recomputed step's hash differs from the hash recorded for it (a resume that did not replay)."""


# Refused input, every family: AppError and the stream's StreamError (a layer below, which cannot import this one, so
# it keeps its own base). The CLI reports an exception of either as one line naming the file or field, exit 2.
INPUT_ERRORS: tuple[type[Exception], ...] = (AppError, StreamError)
