"""Bearer-token auth: keys compared in constant time; no keys configured means no auth."""

from __future__ import annotations

import hmac
from pathlib import Path

from starlette.requests import HTTPConnection

from wicore.api.errors import APIError
from wicore.errors import RequestError


def client_address(conn: HTTPConnection) -> str:
    """Who sent a request (or opened a socket): what failed keys and, without keys, rates count by."""
    return conn.client.host if conn.client else "anonymous"


def read_key_file(path: Path) -> list[str]:
    """One key per line; blank lines and lines starting with '#' are skipped."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise RequestError(f"cannot read the API key file {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise RequestError(f"the API key file {path} is not UTF-8 text (byte {exc.start}); write one key per line") from None
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


class Authenticator:
    def __init__(self, keys: tuple[str, ...] | list[str]) -> None:
        self._keys = [k.encode() for k in keys if k]

    def check(self, authorization: str | None) -> str | None:
        """The key the header carries (None when auth is off); raises a 401 APIError otherwise."""
        if not self._keys:
            return None
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise APIError(401, "missing API key: send 'Authorization: Bearer KEY'", code="invalid_api_key")
        given = token.strip().encode()
        # Compare with every key (a list, not a generator any() would stop early) so the time taken
        # does not tell which (or whether one) matched.
        if not any([hmac.compare_digest(given, key) for key in self._keys]):
            raise APIError(401, "incorrect API key", code="invalid_api_key")
        return token.strip()
