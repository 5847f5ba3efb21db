"""A UDP name server on loopback for the DNS discovery tests (EIP-1459
trees signed by the tests themselves)."""

from __future__ import annotations

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
    into character-strings, as zone files do."""

    def __init__(self, records: dict[str, str]):
        self.records = records
        self.questions: list[str] = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

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
