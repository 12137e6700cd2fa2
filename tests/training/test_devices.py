"""A run's or a replay's device and backend are refused by name before any work (training/devices.py)."""
from __future__ import annotations

import sys

import pytest
import torch

from training import devices
from app.cli import main
from training.errors import ConfigError


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "mps", ""])
def test_a_device_that_is_not_cpu_or_cuda_is_refused_by_name(device):
    with pytest.raises(ConfigError, match=f"device {device!r}"):
        devices.run_device(device)


def test_cuda_without_a_cuda_device_is_refused_by_name(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="device 'cuda': no CUDA device on this machine"):
        devices.run_device("cuda")


def test_a_cuda_index_past_the_machines_devices_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match="device 'cuda:3': this machine has 1 CUDA device"):
        devices.run_device("cuda:3")
    assert devices.run_device("cuda:0") == torch.device("cuda:0")


def test_cpu_is_the_cpu():
    assert devices.run_device("cpu") == torch.device("cpu")
    assert devices.run_device(torch.device("cpu")) == torch.device("cpu")


def test_the_triton_backend_without_triton_is_refused_by_name(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` now fails as if it were not installed
    with pytest.raises(ConfigError, match="backend 'triton': .*needs the triton package"):
        devices.run_backend("triton")


def test_an_unknown_backend_is_refused_by_name():
    with pytest.raises(ConfigError, match="backend 'cutlass'"):
        devices.run_backend("cutlass")


def test_train_refuses_a_bad_device_before_it_makes_the_run_directory(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--config", "tiny", "--steps", "1", "--device", "gpu", "--out", str(out)]) == 2
    assert "ConfigError: device 'gpu'" in capsys.readouterr().err
    assert not out.exists()  # nothing to clean up: the same command with --device cpu can run next
