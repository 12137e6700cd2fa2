"""tests/gpu/conftest.py: under xdist, a test that ran out of device memory runs again alone, once; nothing else is
retried, and without xdist nothing is. Checked on the CPU with stand-in errors, in a pytest of its own."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

CONFTEST = Path(__file__).resolve().parent / "gpu" / "conftest.py"

TESTS = '''
import os
from pathlib import Path

import torch


def calls(name):
    p = Path(os.environ["RERUN_COUNTS"]) / name
    n = int(p.read_text()) + 1 if p.exists() else 1
    p.write_text(str(n))
    return n


def test_oom_once():
    if calls("once") == 1:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def test_triton_oom_once():
    if calls("triton") == 1:
        raise RuntimeError("Triton Error [CUDA]: out of memory")


def test_oom_alone_too():
    calls("always")
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 200.00 GiB")


def test_wrong_bits():
    calls("bits")
    assert 1 == 2
'''


def _run(tmp_path: Path, *args: str) -> tuple[dict[str, str], dict[str, int], str]:
    """(outcome by test name, calls by counter, output) of the stand-in tests run with the conftest."""
    suite, counts = tmp_path / "suite", tmp_path / "counts"
    shutil.rmtree(counts, ignore_errors=True)
    counts.mkdir()
    suite.mkdir(exist_ok=True)
    shutil.copy(CONFTEST, suite / "conftest.py")
    (suite / "test_standins.py").write_text(TESTS)
    report = tmp_path / "report.xml"
    # not this run's xdist worker variables: the inner run is a run of its own (with its own workers or none)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["RERUN_COUNTS"] = str(counts)
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "always",
                        f"--junitxml={report}", *args, str(suite)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    outcome = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        failed = case.find("failure") is not None or case.find("error") is not None
        outcome[case.get("name")] = "failed" if failed else "passed"
    return outcome, {f.name: int(f.read_text()) for f in counts.iterdir()}, p.stdout + p.stderr


def test_out_of_memory_beside_other_workers_is_run_again_alone(tmp_path):
    outcome, calls, out = _run(tmp_path, "-n", "2")
    assert outcome == {"test_oom_once": "passed", "test_triton_oom_once": "passed",
                       "test_oom_alone_too": "failed", "test_wrong_bits": "failed"}, out
    assert calls == {"once": 2, "triton": 2, "always": 2, "bits": 1}, out  # a wrong bit is never retried
    assert "test_oom_once: out of device memory beside other workers" in out
    assert "run again alone" in out


def test_without_workers_nothing_is_retried(tmp_path):
    outcome, calls, out = _run(tmp_path, "-p", "no:xdist")
    assert set(outcome.values()) == {"failed"}, out
    assert calls == {"once": 1, "triton": 1, "always": 1, "bits": 1}, out
