"""A Ray cluster of simulated nodes on this machine (`ray.cluster_utils.Cluster`): a head node plus training
slots that join (or leave) while a run is going, so the elastic path of Ray Train runs for real on one box.

Each slot is a separate raylet advertising {"CPU": 1, SLOT: 1}; training workers ask for SLOT, so the
number of slots is the number of workers Ray Train can place. The head carries the driver, the Ray Train
controller and, after training, the auditors (every node's CPUs serve them once the workers are gone).
"""
from __future__ import annotations

from training.ray_auth import auth_mode, token_auth

auth_mode()  # before anything imports ray, which reads RAY_AUTH_MODE once, as it is imported

SLOT = "trainslot"  # the custom resource one training worker needs
WORKER_RESOURCES = {"CPU": 1, SLOT: 1}


class LocalCluster:
    """Start with `with LocalCluster(head_cpus, slots) as c:`; `c.add_slot()`, `c.remove_slot()`; stopped on exit."""

    def __init__(self, head_cpus: int = 2, slots: int = 1) -> None:
        self.head_cpus, self.initial_slots = head_cpus, slots
        self.cluster = None
        self.slots: list = []

    def __enter__(self) -> "LocalCluster":
        import ray
        from ray.cluster_utils import Cluster

        token_auth()  # before the head starts: its processes and every node's inherit the mode and the token
        if ray.is_initialized():
            raise RuntimeError("LocalCluster: this process is already connected to Ray; it starts its own cluster")
        # no dashboard: nothing here needs it, and a second local cluster would find its port taken
        self.cluster = Cluster(initialize_head=True,
                               head_node_args={"num_cpus": self.head_cpus, "include_dashboard": False})
        for _ in range(self.initial_slots):
            self.add_slot()
        ray.init(address=self.cluster.address, log_to_driver=False)
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
