"""benchmarks/hp_tma.py's isolation: a child that hangs, crashes or reports comes back as a row (no GPU needed)."""
from __future__ import annotations

import json
import sys
import time

from benchmarks.hp_tma import run_isolated, table


def test_a_hung_variant_is_reported_as_a_timeout_not_waited_on():
    t = time.monotonic()
    row = run_isolated("tma-ws", "logits", 0.5, command=[sys.executable, "-c", "import time; time.sleep(30)"])
    assert time.monotonic() - t < 10
    assert row["status"].startswith("timeout after 0.5 s") and row["variant"] == "tma-ws"


def test_a_crash_is_reported_with_its_last_lines():
    row = run_isolated("tma", "dh", 30, command=[sys.executable, "-c", "raise SystemExit('no TMA on this device')"])
    assert row["status"].startswith("error (exit 1)") and "no TMA on this device" in row["status"]


def test_the_childs_last_line_is_its_row():
    report = {"variant": "tma", "shape": [1, 2, 3, 4], "same_bits": False, "production_ms": 2.0, "variant_ms": 4.0,
              "ratio": 0.5}
    code = f"print('compiling'); print({json.dumps(json.dumps(report))})"
    row = run_isolated("tma", "ragged", 30, command=[sys.executable, "-c", code])
    assert row["status"] == "ok" and row["same_bits"] is False and row["ratio"] == 0.5
    text = table([row, run_isolated("tma-ws", "ragged", 0.5, command=[sys.executable, "-c",
                                                                      "import time; time.sleep(30)"])])
    assert "| tma | ragged | ok | False | 2.000 | 4.000 | 0.50x |" in text
    assert "| tma-ws | ragged | timeout after 0.5 s" in text
