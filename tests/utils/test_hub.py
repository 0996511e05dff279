"""A Hub id that cannot be read here is refused at once, naming why, instead of after the Hub
client's five retries (~25 s offline); one in the local cache, or with a reachable endpoint,
or under HF_HUB_OFFLINE, is left to the loader."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from roll.utils.hub import PROXY_VARIABLES, check_hub_id, endpoint_unreachable

CLOSED = "http://127.0.0.1:{port}"


def _closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_unreachable_endpoint_is_refused_naming_host_and_port(monkeypatch):
    port = _closed_port()
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", CLOSED.format(port=port))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(FileNotFoundError) as caught:
        check_hub_id("someorg/no-such-model")
    message = str(caught.value)
    assert f"127.0.0.1:{port} cannot be reached" in message
    assert "the Hugging Face cache does not hold it" in message


def test_reachable_endpoint_and_offline_mode_are_left_to_the_loader(monkeypatch):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        assert endpoint_unreachable(CLOSED.format(port=port)) is None
        monkeypatch.setenv("HF_ENDPOINT", CLOSED.format(port=port))
        check_hub_id("someorg/no-such-model")  # reachable: the loader says what it finds
    monkeypatch.setenv("HF_ENDPOINT", CLOSED.format(port=_closed_port()))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    check_hub_id("someorg/no-such-model")  # offline: the Hub client fails fast by itself
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    check_hub_id("someorg/no-such-model")  # a proxy may reach what a direct probe cannot
    assert "names no host" in endpoint_unreachable("not-a-url")


def test_an_id_in_the_local_cache_is_not_probed(tmp_path):
    """The cache as huggingface_hub lays it out: models--org--name/refs/main names a snapshot
    that holds config.json. HF_HUB_CACHE is read when huggingface_hub is imported, hence a
    fresh interpreter."""
    repo = tmp_path / "models--someorg--cached-model"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text("{}")
    env = dict(os.environ, HF_HUB_CACHE=str(tmp_path), HF_ENDPOINT=CLOSED.format(
        port=_closed_port()))
    for name in ("HF_HUB_OFFLINE", *PROXY_VARIABLES):
        env.pop(name, None)
    code = ("from roll.utils.hub import check_hub_id\n"
            "check_hub_id('someorg/cached-model')\n"
            "try:\n    check_hub_id('someorg/other-model')\n"
            "except FileNotFoundError:\n    print('refused')\n")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, cwd=Path(__file__).resolve().parents[2], timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "refused"


def test_a_dataset_is_probed_unless_some_of_it_is_cached_or_offline(tmp_path, monkeypatch):
    """A table ``datasets`` built earlier (HF_DATASETS_CACHE/org___name) is what it falls
    back to when the Hub is away: not refused. Nothing cached: refused."""
    monkeypatch.setenv("HF_ENDPOINT", CLOSED.format(port=_closed_port()))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path))
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", *PROXY_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(FileNotFoundError, match="is not a local file or folder"):
        check_hub_id("someorg/some-set", "dataset")
    (tmp_path / "someorg___some-set").mkdir()
    check_hub_id("someorg/some-set", "dataset")
    with pytest.raises(FileNotFoundError):  # a model of that name is another thing
        check_hub_id("someorg/some-set")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    check_hub_id("someorg/other-set", "dataset")  # datasets fails fast by itself offline
