"""The replay's refusals: inputs it will not audit. Subclasses AppError, so the CLI exits 2 with the message."""
from __future__ import annotations

from training.errors import AppError


class AuditRefused(AppError):
    """The run (or the corpus given for it) cannot be audited as it is: the message names the file and why."""
