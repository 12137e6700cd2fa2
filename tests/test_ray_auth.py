"""Ray with token authentication on (training/ray_auth.py), on loopback: the local head the tests start requires
this test session's token (tests/conftest.py). A job submitted with it runs; the job API refuses a request
without it or with another token, and so does the head's GCS a driver that brings another token."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from training.ray_auth import TOKEN, TOKEN_PATH, token_auth

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def head():
    """(dashboard URL, GCS address) of a local head started with authentication on."""
    assert token_auth() == "token"
    ctx = ray.init(address="local", num_cpus=1, include_dashboard=True, dashboard_port=0, log_to_driver=False)
    yield f"http://{ctx.dashboard_url}", ctx.address_info["gcs_address"]
    ray.shutdown()


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
