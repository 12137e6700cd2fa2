"""A Ray cluster of simulated nodes on this machine (`ray.cluster_utils.Cluster`): a head node plus training
slots that join (or leave) while a run is going, so the elastic path of Ray Train runs for real on one box.

Each slot is a separate raylet advertising {"CPU": 1, SLOT: 1}; training workers ask for SLOT, so the
number of slots is the number of workers Ray Train can place. The head carries the driver, the Ray Train
controller and, after training, the auditors (every node's CPUs serve them once the workers are gone).

Every Ray head's dashboard agent listens on port 52365 unless told otherwise, and `ray.init` cannot tell it: a head
started while another holds that port gets no agent of its own, and its job API answers "No available agent to
submit job" for as long as the other runs. So the head's agent takes a free port.
"""
from __future__ import annotations

import socket

from training.ray_auth import auth_mode, token_auth

auth_mode()  # before anything imports ray, which reads RAY_AUTH_MODE once, as it is imported

SLOT = "trainslot"  # the custom resource one training worker needs
WORKER_RESOURCES = {"CPU": 1, SLOT: 1}


def free_port() -> int:
    """A TCP port nothing listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalCluster:
    """Start with `with LocalCluster(head_cpus, slots) as c:`; `c.add_slot()`, `c.remove_slot()`; stopped on exit.

    `dashboard`: the head serves the dashboard and its job API (`c.dashboard_url`) on a free port; `temp_dir`:
    Ray's temporary directory for this cluster (Ray's job agent finds its files through the directory's
    `session_latest` link, so a head beside another cluster in the shared default can hand jobs to the other's)."""

    def __init__(self, head_cpus: int = 2, slots: int = 1, *, dashboard: bool = False,
                 temp_dir: str | None = None) -> None:
        self.head_cpus, self.initial_slots, self.dashboard, self.temp_dir = head_cpus, slots, dashboard, temp_dir
        self.cluster = None
        self.slots: list = []
        self.dashboard_url: str | None = None
        self.gcs_address: str | None = None

    def __enter__(self) -> "LocalCluster":
        import ray
        from ray.cluster_utils import Cluster

        token_auth()  # before the head starts: its processes and every node's inherit the mode and the token
        if ray.is_initialized():
            raise RuntimeError("LocalCluster: this process is already connected to Ray; it starts its own cluster")
        head = {"num_cpus": self.head_cpus, "include_dashboard": self.dashboard,
                "dashboard_agent_listen_port": free_port()}
        if self.dashboard:
            head["dashboard_port"] = 0  # a free one
        if self.temp_dir is not None:
            head["temp_dir"] = self.temp_dir
        self.cluster = Cluster(initialize_head=True, head_node_args=head)
        try:
            for _ in range(self.initial_slots):
                self.add_slot()
            ctx = ray.init(address=self.cluster.address, log_to_driver=False)
        except BaseException:
            self.cluster.shutdown()
            raise
        self.gcs_address = ctx.address_info["gcs_address"]
        if self.dashboard:
            self.dashboard_url = f"http://{ctx.dashboard_url}"
        return self

    def add_slot(self):
        """A new node with one training slot (what a machine joining the cluster looks like to Ray)."""
        node = self.cluster.add_node(num_cpus=1, resources={SLOT: 1})
        self.slots.append(node)
        return node

    def remove_slot(self) -> None:
        """The last slot's node goes away (its raylet is killed, as when a machine is lost)."""
        self.cluster.remove_node(self.slots.pop())

    def __exit__(self, *exc) -> None:
        import ray

        ray.shutdown()
        if self.cluster is not None:
            self.cluster.shutdown()
