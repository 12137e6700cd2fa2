"""Ray with token authentication on (training/ray_auth.py), on loopback: the local head the tests start requires
the token made for this test run (tests/conftest.py). A job submitted with it runs; the job API refuses a request
without it or with another token, and so does the head's GCS a driver that brings another token."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from training.ray_auth import TOKEN, TOKEN_PATH, token_auth

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def head():
    """(dashboard URL, GCS address) of a local head started with authentication on, in a Ray temporary directory
    of its own (see tests/conftest.py's ray_temp_dir)."""
    from app.local_cluster import LocalCluster

    assert token_auth() == "token"
    tmp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    with LocalCluster(head_cpus=1, slots=0, dashboard=True, temp_dir=tmp) as c:
        yield c.dashboard_url, c.gcs_address
    shutil.rmtree(tmp, ignore_errors=True)


def _token() -> str:
    return os.environ.get(TOKEN) or Path(os.environ[TOKEN_PATH]).read_text().strip()


def _status(url: str, body: dict | None = None, token: str | None = None) -> int:
    """The HTTP status of a GET (or, with `body`, a POST of JSON) to the dashboard."""
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_a_job_submitted_with_the_token_runs(head, submit_job):
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(head[0])  # sends the token, found as every Ray process finds it
    job = submit_job(client, entrypoint=f"{sys.executable} -c \"print('ran ' + str(6 * 7))\"")
    deadline = time.time() + 120
    while client.get_job_status(job) not in (JobStatus.SUCCEEDED, JobStatus.FAILED) and time.time() < deadline:
        time.sleep(0.5)
    assert client.get_job_status(job) == JobStatus.SUCCEEDED
    assert "ran 42" in client.get_job_logs(job)


def test_the_job_api_refuses_a_request_without_the_token_or_with_another(head):
    jobs = head[0] + "/api/jobs/"
    attack = {"entrypoint": "touch /tmp/should-not-exist"}
    assert _status(jobs, attack) == 401
    assert _status(jobs, attack, token="0" * 64) in (401, 403)
    assert _status(jobs) == 401
    assert _status(jobs, token=_token()) == 200  # the same request with the token is answered


def test_the_gcs_refuses_a_driver_with_another_token(head):
    env = {**os.environ, TOKEN: "0" * 64, "RAY_AUTH_MODE": "token"}
    code = f"import ray; ray.init(address={head[1]!r}); print('joined')"
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "joined" not in p.stdout
    assert "AuthenticationError" in p.stderr and "InvalidAuthToken" in p.stderr


def test_a_fresh_machine_gets_a_token_and_a_working_cluster(tmp_path):
    """As `make demo` runs on a machine with no token and no RAY_AUTH_MODE: the local cluster of simulated nodes
    starts with authentication on, its driver joins it (Ray reads the mode when it is imported, so the modules
    that use Ray set it as they are imported), and the token file is created readable by its owner alone."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    code = ("import ray\nfrom app.local_cluster import LocalCluster\n"
            "with LocalCluster(head_cpus=1, slots=0):\n"
            "    print('sum', ray.get(ray.remote(lambda: 6 * 7).remote()))\n")
    code = "import app.local_cluster\n" + code  # what app.demo does: ours first, then ray
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0 and "sum 42" in p.stdout, p.stderr[-3000:]
    token = tmp_path / ".ray" / "auth_token"
    assert token.is_file() and len(token.read_text()) == 64 and token.stat().st_mode & 0o777 == 0o600
