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


@pytest.mark.parametrize("name", ["cluster.yaml", "cluster-aws.yaml"])
def test_every_node_starts_ray_with_token_authentication(name):
    config = yaml.safe_load((ROOT / name).read_text())
    starts = [c for key in ("head_start_ray_commands", "worker_start_ray_commands") for c in config[key]
              if "ray start" in c]
    assert len(starts) == 2 and all("RAY_AUTH_MODE=token ray start" in c for c in starts)
    head = next(c for c in config["head_start_ray_commands"] if "--head" in c)
    assert "--dashboard-host=127.0.0.1" in head  # reached through `ray dashboard` port-forwarding only
    assert config["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"  # the launching machine's token
    assert any("chmod 600 ~/.ray/auth_token" in c for c in config["setup_commands"])


def test_no_tracked_file_switches_authentication_off_or_holds_a_token():
    import subprocess

    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    off = "RAY_AUTH_MODE" + "=disabled"  # spelled apart so that this file does not match itself
    hits = [f for f in files if (ROOT / f).is_file() and off in (ROOT / f).read_text(errors="replace")]
    assert hits == []
    assert not [f for f in files if Path(f).name == "auth_token"]
