"""A local Ray head for tests that submit jobs: its dashboard agent on a free port.

Every Ray head's dashboard agent listens on port 52365 unless told otherwise, and `ray.init` cannot tell it. A head
started while another test's head holds that port gets no agent of its own: its job API answers "No available agent
to submit job" (seen beside a running head, for minutes).
"""
from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def job_head(temp_dir: str, num_cpus: int) -> Iterator[tuple[str, str]]:
    """(dashboard URL, GCS address) of a head with its dashboard, in `temp_dir`, this process connected to it; shut
    down on exit."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": num_cpus, "include_dashboard": True, "dashboard_port": 0,
        "dashboard_agent_listen_port": free_port(), "temp_dir": temp_dir})
    try:
        ctx = ray.init(address=cluster.address, log_to_driver=False)
        try:
            yield f"http://{ctx.dashboard_url}", ctx.address_info["gcs_address"]
        finally:
            ray.shutdown()
    finally:
        cluster.shutdown()
