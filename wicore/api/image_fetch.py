"""Fetching an image URL (`--allow-image-urls`) without becoming a door into the server's network.

    url ──► http(s) only ──► getaddrinfo ──► every address public (or allowed)? ──► connect to it
        ──► GET (h11) ──► 200: the body, at most max_bytes
                      └─► 301/302/303/307/308: the same checks on its Location, at most 5 hops
    all of it within one deadline (`timeout`, the whole fetch: a server dripping a byte a second
    cannot stretch it), on the event loop: no executor thread waits on a slow server, and a
    server shutting down cancels a fetch like any other await.

Refused targets: loopback, private, link-local (169.254.0.0/16: cloud metadata services),
multicast, unspecified, reserved and every other non-global address, an IPv4-mapped IPv6
address as the IPv4 address it maps; whatever spelling named them (`127.1`, `2130706433`,
`[::ffff:127.0.0.1]`, a DNS name), since the check is on the resolved addresses and the
connection goes to the address that was checked. `allowed_networks` (`--image-url-allow-network`)
lets deliberate intranet targets through. No proxy from the environment is used.

Every failure (a refused address, a closed, silent or slow port, an error status, too many
bytes) is the same error text, so that a client cannot scan ports with it; the reason goes to
the server log.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import ssl
import threading
from collections.abc import Sequence
from urllib.parse import SplitResult, urljoin, urlsplit

import h11

from wicore.inputs.image_loader import ImageError

log = logging.getLogger("wicore.api")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
MAX_REDIRECTS = 5
REDIRECTS = (301, 302, 303, 307, 308)


class _NotFetched(Exception):
    """Why a fetch failed, for the server log (the client gets the generic text)."""


async def fetch_image(url: str, timeout: float, max_bytes: int, allowed_networks: Sequence[Network] = ()) -> bytes:
    """The bytes of the image at `url` (http or https), fetched as the module docstring says."""
    try:
        return await asyncio.wait_for(_follow(url, max_bytes, tuple(allowed_networks)), timeout)
    except (_NotFetched, OSError, asyncio.TimeoutError, h11.ProtocolError, UnicodeError, ValueError) as exc:
        log.info("image URL %.200s not fetched: %s", url, str(exc) or type(exc).__name__)
        raise ImageError(
            f"the image URL could not be fetched (this server fetches images from public http(s) addresses that "
            f"answer 200 within {timeout:g} s with at most {max_bytes} bytes)"
        ) from None


def is_allowed(address: str, allowed_networks: Sequence[Network] = ()) -> bool:
    """Whether a resolved address may be fetched from: global unicast, or in an allowed network."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 scope id ("fe80::1%eth0")
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if any(ip.version == net.version and ip in net for net in allowed_networks):
        return True
    return ip.is_global and not ip.is_multicast


async def _follow(url: str, max_bytes: int, allowed_networks: tuple[Network, ...]) -> bytes:
    for _ in range(MAX_REDIRECTS + 1):
        status, location, body = await _get(_target(url), max_bytes, allowed_networks)
        if status == 200:
            return body
        if status not in REDIRECTS or not location:
            raise _NotFetched(f"HTTP status {status}")
        url = urljoin(url, location)
    raise _NotFetched(f"more than {MAX_REDIRECTS} redirects")


def _target(url: str) -> SplitResult:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _NotFetched(f"not an http(s) URL: {url[:100]!r}")
    return parts


async def _get(url: SplitResult, max_bytes: int, allowed: tuple[Network, ...]) -> tuple[int, str | None, bytes]:
    """One GET: (status, Location header, body: read only for a 200)."""
    host, is_https = url.hostname or "", url.scheme == "https"
    port = url.port or (443 if is_https else 80)
    addresses = await _resolve(host, port)
    refused = [a for a in addresses if not is_allowed(a, allowed)]
    if refused or not addresses:
        raise _NotFetched(f"{host} resolves to {', '.join(refused) or 'nothing'}: not a public address")
    context = ssl.create_default_context() if is_https else None
    reader, writer = await asyncio.open_connection(addresses[0], port, ssl=context, server_hostname=host if is_https else None)
    try:
        conn = h11.Connection(h11.CLIENT)
        name = f"[{host}]" if ":" in host else host
        headers = [
            ("Host", name if url.port is None else f"{name}:{url.port}"),
            ("User-Agent", "wicore"),
            ("Accept", "image/*"),
            ("Connection", "close"),
        ]
        target = (url.path or "/") + (f"?{url.query}" if url.query else "")
        writer.write(conn.send(h11.Request(method="GET", target=target, headers=headers)) or b"")
        writer.write(conn.send(h11.EndOfMessage()) or b"")
        await writer.drain()
        status, location, body = 0, None, bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await reader.read(1 << 16))
            elif isinstance(event, h11.Response):
                status = event.status_code
                location = next((v.decode("latin-1") for k, v in event.headers if k == b"location"), None)
                if status != 200:
                    return status, location, b""
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > max_bytes:
                    raise _NotFetched(f"more than {max_bytes} bytes")
            elif isinstance(event, h11.EndOfMessage):
                return status, location, bytes(body)
            elif isinstance(event, h11.ConnectionClosed):
                raise _NotFetched("the connection closed before the response ended")
    finally:
        writer.close()


async def _resolve(host: str, port: int) -> list[str]:
    """The addresses `host` resolves to, looked up in a daemon thread of its own: a slow resolver
    holds neither the executor that decodes images nor the process's exit."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[list[str]] = loop.create_future()

    def settle(result: list[str] | OSError) -> None:
        if future.done():  # the fetch was cancelled (its deadline passed) meanwhile
            return
        if isinstance(result, OSError):
            future.set_exception(result)
        else:
            future.set_result(result)

    def lookup() -> None:
        try:
            result: list[str] | OSError = list(
                dict.fromkeys(str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
            )
        except OSError as exc:
            result = exc
        except UnicodeError as exc:  # an IDNA name that does not encode
            result = OSError(str(exc))
        with contextlib.suppress(RuntimeError):  # the loop has closed
            loop.call_soon_threadsafe(settle, result)

    threading.Thread(target=lookup, name="wicore-resolve", daemon=True).start()
    return await future
