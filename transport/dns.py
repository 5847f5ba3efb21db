"""DNS lookups for EIP-1459 node discovery: TXT records over UDP/TCP with
dnspython's trio resolver, and the walk of a whole tree
(:class:`~wakustore.protocols.dns_discovery.TreeWalk` decides what to ask
and checks every answer).

Name servers are given as ``host`` or ``host:port`` (nwaku's
``--dns-discovery-name-server``); none: the system's resolver
configuration. Every lookup is bounded by ``timeout_s``, a walk by the
walk's own entry, depth and record caps.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

import trio

from wakustore.protocols.dns_discovery import TreeWalk, parse_url

DNS_PORT = 53
# Lookups a walk has in flight at once.
WALK_BATCH = 8
LOOKUP_TIMEOUT_S = 5.0


class DnsLookupError(Exception):
    """A name server did not answer, or answered with an error."""


def parse_name_server(text: str) -> tuple[str, int] | None:
    """(address, port) of ``host``, ``host:port``, ``[v6]:port``; None if not an IP."""
    host, port = text, DNS_PORT
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest:
            if not rest.startswith(":") or not rest[1:].isdigit():
                return None
            port = int(rest[1:])
    elif text.count(":") == 1:
        host, _, digits = text.partition(":")
        if not digits.isdigit():
            return None
        port = int(digits)
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return None
    return (host, port) if 0 < port < 65536 else None


async def resolve_txt(name: str, name_servers: Sequence[str] = (), timeout_s: float = LOOKUP_TIMEOUT_S) -> list[str]:
    """The TXT records at ``name``, each record's strings joined (as
    go-ethereum's resolver joins them); [] when the name does not exist or
    has none. Raises :class:`DnsLookupError` when no answer comes."""
    import dns.asyncresolver
    import dns.exception
    import dns.nameserver
    import dns.resolver

    resolver = dns.asyncresolver.Resolver(configure=not name_servers)
    if name_servers:
        servers = [parse_name_server(s) for s in name_servers]
        resolver.nameservers = [dns.nameserver.Do53Nameserver(host, port) for host, port in filter(None, servers)]
    resolver.lifetime = timeout_s
    try:
        answer = await resolver.resolve(name, "TXT", search=False)
    except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
        return []
    except dns.exception.DNSException as exc:
        raise DnsLookupError(f"{name}: {exc}") from None
    return [b"".join(record.strings).decode("ascii", "replace") for record in answer]


async def walk_tree(url: str, name_servers: Sequence[str] = (), timeout_s: float = LOOKUP_TIMEOUT_S) -> TreeWalk:
    """Walk the tree of ``url`` (``enrtree://<key>@<domain>``) to its end or
    its first fault (``walk.error``); the verified ``enr:`` texts are in
    ``walk.enrs``. Raises :class:`DnsLookupError` when a lookup fails."""
    walk = TreeWalk(parse_url(url))

    async def look_up(name: str, found: dict[str, list[str] | DnsLookupError]) -> None:
        try:
            found[name] = await resolve_txt(name, name_servers, timeout_s)
        except DnsLookupError as exc:  # raised below, outside the nursery's exception group
            found[name] = exc

    while not walk.done:
        names = walk.next_names(limit=WALK_BATCH)
        if not names:
            break
        found: dict[str, list[str] | DnsLookupError] = {}
        async with trio.open_nursery() as nursery:
            for name in names:
                nursery.start_soon(look_up, name, found)
        for name in names:
            answer = found[name]
            if isinstance(answer, DnsLookupError):
                raise answer
            walk.feed(name, answer)
    return walk
