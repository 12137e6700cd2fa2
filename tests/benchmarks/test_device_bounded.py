"""benchmarks/device/bounded.sh, the device scripts' step runner: a step that outlives its limit is killed with
every process it started (pytest's xdist workers among them), its log comes back, and the exit status is the
step's."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    script = f"export OUT={tmp_path} BOUNDED_NO_INSTALL=1\nsource benchmarks/device/bounded.sh\n{body}\n"
    return subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_a_step_past_its_limit_is_killed_with_its_children(tmp_path):
    marker = f"sleep 41.{time.time_ns() % 1000:03d}"  # a name no other process has
    t0 = time.monotonic()
    done = _run(tmp_path, f"bounded hang 1 bash -c 'echo started; {marker} & {marker}'; echo \"status $?\"")
    assert time.monotonic() - t0 < 20
    assert "hang: killed after 1 s" in done.stdout and "status 137" in done.stdout
    assert (tmp_path / "hang.log").read_text().startswith("started")
    assert not _running(marker)


def _running(text: str) -> list[str]:
    """Command lines of the processes whose command line contains `text`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            line = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # the process ended meanwhile
            continue
        if text in line:
            found.append(line)
    return found


def test_a_finished_step_returns_its_status_and_log_tail(tmp_path):
    done = _run(tmp_path, "TAILN=1 bounded ok 30 bash -c 'echo one; echo two; exit 3'; echo \"status $?\"")
    assert done.stdout.splitlines() == ["== ok: exit 3", "two", "status 3"]
    assert (tmp_path / "ok.log").read_text() == "one\ntwo\n"
