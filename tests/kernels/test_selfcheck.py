"""The self-check `make demo` shows: every accuracy probe within its stated bound, every digest golden."""
from kernels.accuracy import PROBES
from kernels.selfcheck import main


def test_every_accuracy_probe_within_its_bound():
    over = [(p.op, p.metric, v, p.bound) for p in PROBES if (v := p.measure()) > p.bound]
    assert not over, over


def test_selfcheck_passes(capsys):
    assert main([]) == 0
    assert "PASS" in capsys.readouterr().out
