"""Ray with token authentication on: every Ray instance this project starts or joins requires Ray's shared-secret
token (`RAY_AUTH_MODE=token`) on its GCS, its dashboard and its job API, so that whoever reaches a port cannot
submit a job and run code on the nodes.

Ray reads the token from `RAY_AUTH_TOKEN`, else the file `RAY_AUTH_TOKEN_PATH`, else `~/.ray/auth_token`. A local
`ray.init()` generates the default file itself when none exists; `ray start` and `ray.cluster_utils.Cluster` do not,
so `token_auth()` creates it as `ray get-auth-token --generate` does before anything starts Ray. Ray reads
RAY_AUTH_MODE once, when it is imported: the modules that use Ray call `auth_mode()` as they are imported, so
the mode is set before anything imports ray (a driver whose Ray saw no mode would be refused). A cluster's nodes
get the launching machine's file from the cluster files (docs/cluster.md). An explicit `RAY_AUTH_MODE` in the
environment is the operator's choice and is left as it is.
"""
from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path

from stream.fileio import fsync_path

MODE, TOKEN, TOKEN_PATH = "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"


def default_token_file() -> Path:
    """Where Ray looks for the token when neither variable names one."""
    return Path.home() / ".ray" / "auth_token"


def auth_mode() -> str:
    """Token authentication on for this process and the Ray processes it starts, unless RAY_AUTH_MODE is set;
    returns the mode in force. Ray reads the variable once, when it is first imported: the modules that use Ray
    call this as they are imported, before anything imports ray."""
    return os.environ.setdefault(MODE, "token")


def token_auth() -> str:
    """`auth_mode()`, and a token where the mode is "token" and none exists (before Ray starts or is joined)."""
    mode = auth_mode()
    if mode == "token" and not os.environ.get(TOKEN) and not os.environ.get(TOKEN_PATH):
        path = default_token_file()
        if not path.is_file():
            _create_token_file(path)
    return mode


def _create_token_file(path: Path) -> None:
    """A new random token at `path`, readable by its owner only; written whole to a temporary file and linked into
    place, so a reader never sees half a token and a token another process created meanwhile is kept."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".auth_token.", dir=path.parent)  # mode 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        fsync_path(tmp)
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
