"""Fixtures shared across packages."""
import os

import pytest


@pytest.fixture(scope="module")
def ray_session():
    """A small local Ray for a test module (reused if one is already running), shut down after it."""
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    started = not ray.is_initialized()
    if started:
        # "local": our own instance, even while another pytest worker's simulated cluster is the latest address
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()
