"""The cluster files pass Ray's own validation, as `ray up` runs it (prepare_config, then the schema)."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", ["cluster.yaml", "cluster-aws.yaml"])
def test_ray_accepts_the_cluster_file(name):
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = prepare_config(yaml.safe_load((ROOT / name).read_text()))
    validate_config(config)  # raises jsonschema.ValidationError naming the offending key
    assert config["head_node_type"] in config["available_node_types"]


def test_gpu_nodes_install_the_cuda_build():
    aws = yaml.safe_load((ROOT / "cluster-aws.yaml").read_text())
    gpu = aws["available_node_types"]["gpu_worker"]
    assert any("constraints/gpu.txt" in c and "[gpu]" in c for c in gpu["worker_setup_commands"])
    pins = dict(line.split("==") for line in (ROOT / "constraints" / "gpu.txt").read_text().splitlines()
                if line and not line.startswith("#"))
    assert pins["ray"] == "2.60.0" and "torch" in pins and "triton" in pins
