"""Which addresses a webhook may reach: an endpoint's URL is given over the API, so without a
check anyone with the admin scope could make dueflow POST into its own network (a metadata
service, a database's HTTP port).

A URL is checked when the endpoint is created or changed (:func:`check_url`) and again at every
send (:func:`resolve`): the name is resolved, every address it resolves to must be public, and
the request goes to the address that was checked (DNS may answer otherwise a second later).
``DUEFLOW_WEBHOOK_ALLOW_PRIVATE`` lets them through (tests, examples, a host on the same network).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from urllib.parse import SplitResult, urlsplit

from dueflow.exceptions import UnsafeURL

#: The longest URL an endpoint may have.
MAX_URL = 2000


def parse(url: str) -> SplitResult:
    """The URL's parts, if it is an http(s) URL with a host and a valid port.

    Raises:
        UnsafeURL: another scheme, no host, a bad port, user info, or over 2,000 characters.
    """
    if len(url) > MAX_URL:
        raise UnsafeURL(f"a webhook URL has at most {MAX_URL} characters")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - a port out of range raises here
    except ValueError:
        raise UnsafeURL("not a URL (check the port)") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UnsafeURL("a webhook URL is http:// or https:// with a host")
    if parts.username is not None or parts.password is not None:
        raise UnsafeURL("a webhook URL carries no user or password (sign with its secret)")
    if any(ord(c) < 33 or ord(c) == 127 for c in url):
        raise UnsafeURL("a webhook URL has no spaces or control characters")
    return parts


def is_public(address: str) -> bool:
    """The address is one a webhook may reach: not private, loopback, link-local, unspecified,
    multicast or reserved (an IPv4 address mapped into IPv6 is judged as the IPv4 one)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    refused = (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_unspecified
        or ip.is_multicast
        or ip.is_reserved
    )
    return ip.is_global and not refused


async def resolve(url: str, *, allow_private: bool) -> list[str]:
    """The addresses ``url``'s host resolves to, every one checked.

    Raises:
        UnsafeURL: a bad URL, a name that does not resolve, or (unless ``allow_private``) an
            address that is not public; the message names the host, never the address it
            resolved to (no map of the network through error messages).
    """
    parts = parse(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        found = await asyncio.get_running_loop().getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
    except (socket.gaierror, UnicodeError) as exc:
        raise UnsafeURL(f"{host} does not resolve ({type(exc).__name__})") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in found))
    if not addresses:
        raise UnsafeURL(f"{host} does not resolve")
    if not allow_private and not all(is_public(a) for a in addresses):
        raise UnsafeURL(
            f"{host} is (or resolves to) a private, loopback, link-local or reserved address"
        )
    return addresses


async def check_url(url: str, *, allow_private: bool) -> str:
    """``url`` when a webhook may be sent to it (see :func:`resolve`).

    Raises:
        UnsafeURL: it may not.
    """
    await resolve(url, allow_private=allow_private)
    return url


def pinned(url: str, address: str) -> tuple[str, dict[str, str], str]:
    """The request that goes to ``address`` (a checked one) instead of looking ``url``'s host
    up again: the URL with the address as its host, the ``Host`` header, and the name TLS
    checks the certificate against (httpx's ``sni_hostname``)."""
    parts = parse(url)
    host = parts.hostname or ""
    literal = f"[{address}]" if ":" in address else address
    netloc = literal if parts.port is None else f"{literal}:{parts.port}"
    header = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=netloc).geturl(), {"Host": header}, host
