from __future__ import annotations

import subprocess
import sys

import pytest

from wicore.api.auth import Authenticator, read_key_file
from wicore.api.errors import APIError


def test_no_keys_means_no_auth():
    assert Authenticator([]).check(None) is None


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer ", "Basic k1", "Bearer nope"])
def test_missing_or_wrong_key_is_401(header):
    with pytest.raises(APIError) as info:
        Authenticator(["k1", "k2"]).check(header)
    assert info.value.status == 401
    assert info.value.body()["error"]["type"] == "authentication_error"


def test_any_configured_key_passes():
    auth = Authenticator(["k1", "k2"])
    assert auth.check("Bearer k2") == "k2" and auth.check("bearer k1") == "k1"


def test_key_file(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# comment\nk1\n\n  k2  \n")
    assert read_key_file(path) == ["k1", "k2"]


def test_a_key_file_that_is_not_utf8_is_one_line_and_exit_2(tmp_path):
    """Issue 35: it was a UnicodeDecodeError traceback."""
    path = tmp_path / "keys"
    path.write_bytes(b"k1\n\xff\xfe latin-1 \xe9\n")
    res = subprocess.run(
        [sys.executable, "-m", "wicore.cli", "serve", "--model", str(tmp_path), "--api-key-file", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2
    assert res.stderr == f"wicore: error: the API key file {path} is not UTF-8 text (byte 3); write one key per line\n"
