"""quant's exceptions: messages name the layer, expert, projection or file, and what was expected."""
from __future__ import annotations

from training.errors import AppError


class QuantError(AppError):
    """Base class of every error raised by `quant` (an AppError: the CLI prints it and exits 2)."""


class ConfigError(QuantError, ValueError):
    """A setting is out of range: names the field and the allowed values."""


class FormatError(QuantError, ValueError):
    """A tensor does not fit the rvq256_256x8 format: names the tensor and the expected shape or dtype."""


class FitError(QuantError):
    """The fit cannot proceed (non-finite values, a Hessian that will not factor): names layer/expert/projection."""

    def __init__(self, where: str, what: str) -> None:
        self.where = where
        super().__init__(f"{where}: {what}")


class IntegrityError(QuantError):
    """A file or packed tensor does not match what was recorded: names the file and both values."""

    def __init__(self, path: str, expected: str, actual: str, detail: str = "") -> None:
        self.path, self.expected, self.actual = str(path), expected, actual
        msg = f"{path}: expected {expected}, actual {actual}"
        super().__init__(msg + (f" ({detail})" if detail else ""))


def where(layer: int | str, expert: int | str | None, projection: str) -> str:
    """The location string every fit error starts with."""
    e = "all" if expert is None else expert
    return f"layer {layer} expert {e} projection {projection}"
