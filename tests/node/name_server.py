"""A UDP name server on loopback for the DNS discovery tests (EIP-1459
trees signed by the tests themselves)."""

from __future__ import annotations

import errno
import random
import socket
import threading

import dns.flags
import dns.message
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rdtypes.ANY.TXT
import dns.rrset

# The tests' tree: its signing key and domain.
TREE_KEY = bytes(range(40, 72))
DOMAIN = "nodes.wakustore.test"


class NameServer:
    """A UDP name server on loopback answering TXT questions from a table
    (name -> text); NXDOMAIN for the rest. Texts over 255 bytes are split
    into character-strings, as zone files do. ``records`` may be replaced
    while it runs (a tree published anew).

    It listens on ``host`` (127.0.0.1) and ``port`` (0: one from the
    kernel); :meth:`on_port_53` for clients that ask port 53 only."""

    def __init__(self, records: dict[str, str], host: str = "127.0.0.1", port: int = 0):
        self.records = records
        self.questions: list[str] = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self.sock.bind((host, port))
        except OSError:
            self.sock.close()
            raise
        self.sock.settimeout(0.2)
        self.host = host
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @classmethod
    def on_port_53(cls, records: dict[str, str], attempts: int = 20) -> NameServer:
        """A name server on port 53 of a loopback address of its own, for
        clients that cannot be given a port (go-waku's resolver joins its
        name server with "53", waku/v2/dnsdisc/resolver.go): an address of
        127.0.0.0/8 picked at random, another one when it is taken. Port 53
        takes root (or CAP_NET_BIND_SERVICE); without it this raises."""
        for attempt in range(attempts):
            host = f"127.{random.randrange(1, 255)}.{random.randrange(0, 256)}.{random.randrange(1, 255)}"
            try:
                return cls(records, host, 53)
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE or attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    @property
    def address(self) -> str:
        """``host:port``, as nwaku's ``--dns-discovery-name-server`` takes it."""
        return f"{self.host}:{self.port}"

    def __enter__(self) -> NameServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                data, peer = self.sock.recvfrom(4096)
            except TimeoutError:
                continue
            query = dns.message.from_wire(data)
            response = dns.message.make_response(query)
            question = query.question[0]
            name = question.name.to_text(omit_final_dot=True)
            self.questions.append(name)
            text = self.records.get(name)
            if text is None:
                response.set_rcode(dns.rcode.NXDOMAIN)
            else:
                raw = text.encode()
                chunks = [raw[i : i + 255] for i in range(0, len(raw), 255)]
                rdata = dns.rdtypes.ANY.TXT.TXT(dns.rdataclass.IN, dns.rdatatype.TXT, chunks)
                rrset = dns.rrset.RRset(question.name, dns.rdataclass.IN, dns.rdatatype.TXT)
                rrset.add(rdata, 60)
                response.answer.append(rrset)
            response.flags |= dns.flags.AA
            self.sock.sendto(response.to_wire(), peer)
