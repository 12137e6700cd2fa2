"""Fixtures shared across packages."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from training.config import RunConfig
from training.presets import TINY
from training.ray_auth import TOKEN, TOKEN_PATH, token_auth

_token_dir: str | None = None


def pytest_configure(config):
    """Every Ray the tests start requires a token (training.ray_auth), one made for this test run: the suite neither
    reads nor writes the user's ~/.ray/auth_token. xdist's workers inherit the variables from the controller."""
    global _token_dir
    if not os.environ.get(TOKEN) and not os.environ.get(TOKEN_PATH):
        _token_dir = tempfile.mkdtemp(prefix="ray-token-")
        path = Path(_token_dir) / "auth_token"
        path.write_text(os.urandom(32).hex())
        os.environ[TOKEN_PATH] = str(path)
    token_auth()


def pytest_unconfigure(config):
    if _token_dir is not None:
        shutil.rmtree(_token_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_session():
    """A small local Ray for a test module (reused if one is already running), shut down after it."""
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        # "local": our own instance, even while another pytest worker's simulated cluster is the latest address
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


@pytest.fixture(scope="session")
def demo_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo corpus (vocab 4096), built from this interpreter's standard library (~3 s)."""
    from stream import build_demo

    out = tmp_path_factory.mktemp("demo-corpus")
    build_demo(out, vocab_size=TINY.model.vocab_size, progress=False)
    return out


@pytest.fixture(scope="session")
def tiny(demo_corpus: Path) -> RunConfig:
    """The tiny preset reading the session's corpus."""
    return TINY.replace(**{"train.corpus": str(demo_corpus)})


@pytest.fixture(scope="module")
def one_thread():
    """One torch CPU thread for a module (bits do not depend on it): on a busy 2-core machine two threads that
    wait for each other make the tiny model's init and steps several times slower."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def tiny1(tiny: RunConfig) -> RunConfig:
    """tiny with one window per microbatch: tiny's bits (no bit depends on the cut), each window run alone."""
    return tiny.replace(**{"train.micro_batch": 1})


# The heaviest test files, in the order xdist should start them (seconds on a 2-core machine, from a whole suite run
# with --durations: the demo story ~125 alone and ~290 beside other work, test_ray_elastic ~145 and ~205 (mostly
# Ray noticing lost nodes), test_train ~150, test_any_world ~115, the committed log ~90, the Ray equivalence tests
# ~60-120 each). xdist hands files out in collection order (--no-loadscope-reorder) and starts each of its two workers with
# two: the first and third go to one, the second and fourth to the other. So the two longest go first and apart, a
# light file third keeps test_train off the demo story's worker, and what is left goes to whichever worker is free.
# The rest keep pytest's order.
HEAVIEST_FIRST = ("tests/app/test_demo_story.py", "tests/training/test_ray_elastic.py", "tests/test_layering.py",
                  "tests/training/test_train.py", "tests/training/test_any_world.py",
                  "tests/training/test_committed_logs.py", "tests/training/test_ray_hsdp.py",
                  "tests/training/test_ray_train.py")


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(HEAVIEST_FIRST)}
    root = Path(__file__).resolve().parent.parent
    items.sort(key=lambda item: rank.get(Path(item.fspath).resolve().relative_to(root).as_posix(), len(rank)))


@pytest.fixture
def submit_job():
    """submit(client, **kwargs) -> job id: `JobSubmissionClient.submit_job`, retried while the head's job agent is
    still starting (Ray answers 500 "No available agent" for a while after a head starts on a busy machine)."""
    import time

    def submit(client, **kwargs) -> str:
        deadline = time.time() + 300
        while True:
            try:
                return client.submit_job(**kwargs)
            except RuntimeError as e:
                if "No available agent" not in str(e) or time.time() > deadline:
                    raise
                time.sleep(1)

    return submit


@pytest.fixture
def ray_temp_dir():
    """A Ray temporary directory of the test's own (short: Ray's socket paths must fit 107 bytes). Ray's job agent
    finds its working files through the temporary directory's `session_latest` link, so a head started beside another
    test's cluster in the shared default would hand its jobs to the other cluster's files."""
    d = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)

