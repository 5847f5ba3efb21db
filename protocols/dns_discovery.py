"""EIP-1459 Node Discovery via DNS: ``enrtree://`` node lists, sans-IO.

A node list is a merkle tree of DNS TXT records, signed once at its root by
a secp256k1 key that the list's URL names::

    enrtree://<base32 compressed public key>@<domain>

The TXT record at ``<domain>`` is the root, ``enrtree-root:v1 e=<enr-root>
l=<link-root> seq=<n> sig=<base64url r||s||v>``; the signature is over the
keccak256 of the root text without its `` sig=`` part. Every other entry is
at ``<hash>.<domain>``, where ``<hash>`` is the unpadded base32 of the first
16 bytes of the keccak256 of the entry's text: ``enrtree-branch:<h1>,<h2>,..``
(an inner node), ``enr:<base64url record>`` (a leaf of the ENR subtree under
``e=``) or ``enrtree://<key>@<domain>`` (a leaf of the link subtree under
``l=``, naming another list). Formats are those of go-ethereum's
``p2p/dnsdisc`` and nim-dnsdisc (which nwaku uses).

:func:`parse_url`, :func:`parse_root` and :func:`parse_entry` read the text
forms; :func:`build_tree` writes a signed tree; :class:`TreeWalk` reads one
without doing any I/O: it names the DNS names to look up and is fed the TXT
strings found there (one string per TXT record, the record's
character-strings joined, as go-ethereum's resolver does). It checks the
root's signature and each entry's hash against the name it asked for, so
every ENR and link it collects is authenticated by the list's key, even
those collected before a walk stops early. ENR texts are returned as is
(decoding them is :mod:`wakustore.protocols.enr`'s job); links are returned
as URLs and not followed: walking a linked list is a new walk, and the
caller keeps the set of domains already walked.

Bounds of a walk (each a constructor argument, defaults below): entries
looked up (``max_entries``, 2000), depth below the root (``max_depth``, 8),
ENRs and links collected (``max_records``, 1000), and 512 bytes per TXT
string. A walk holds at most ``max_entries`` hashes and ``max_records``
strings of at most 512 bytes. Peer input never raises out of
:meth:`TreeWalk.feed`: the walk stops and keeps a :class:`DnsDiscoveryError`
whose ``reason`` (a :class:`StopReason`) labels the metrics.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum

from wakustore.protocols.crypto import (
    SECP256K1_COMPRESSED_SIZE,
    keccak256,
    private_key_from_bytes,
    public_key_from_bytes,
    sign_recoverable,
    verify_compact,
)
from wakustore.protocols.errors import ProtocolError

# Entry prefixes (EIP-1459 "DNS Record Structure"; go-ethereum tree.go).
ROOT_PREFIX = "enrtree-root:v1"
BRANCH_PREFIX = "enrtree-branch:"
ENR_PREFIX = "enr:"
LINK_PREFIX = "enrtree://"

# Bytes of keccak256 an entry's subdomain holds (go-ethereum hashAbbrev).
HASH_ABBREV_SIZE = 16
# Shortest and longest hash a branch or root may name, in bytes
# (go-ethereum minHashLength and isValidHash); a hash names its entry when it
# is a prefix of the entry's keccak256.
MIN_HASH_SIZE = 12
MAX_HASH_SIZE = 32
# Hashes per branch: 13 base32 hashes of 26 characters and their commas fit
# in 370 bytes, go-ethereum's and nim-dnsdisc's margin under 512 (maxChildren).
MAX_CHILDREN = 13
# EIP-1459: "The content of any TXT record should be small enough to fit
# into the 512 byte limit imposed on UDP DNS packets."
MAX_TXT_SIZE = 512
# r || s || v, go-ethereum crypto.SignatureLength.
SIGNATURE_SIZE = 65
# go-ethereum keeps seq as a Go uint (64 bits).
MAX_SEQ = 2**64 - 1
# DNS: 253 characters in a name, 63 in a label (RFC 1035).
MAX_DOMAIN_SIZE = 253

# Defaults of a walk; neither the EIP nor go-ethereum bounds a walk (nwaku's
# client resolves at most 100 entries per sync). A tree of 1000 records
# under branches of 13 is 4 levels deep and about 1100 entries; 8 levels
# hold 13**7 records.
DEFAULT_MAX_ENTRIES = 2000
DEFAULT_MAX_DEPTH = 8
DEFAULT_MAX_RECORDS = 1000

_BASE32 = re.compile(r"[A-Z2-7]*")
_BASE64URL = re.compile(r"[A-Za-z0-9_-]*")
_LABEL = re.compile(r"[A-Za-z0-9_-]{1,63}")
_SEQ = re.compile(r"[0-9]{1,20}")


class StopReason(str, Enum):
    """Why a walk stopped or an input was refused; the values label metrics."""

    MALFORMED = "malformed"
    NO_ROOT = "no_root"
    BAD_SIGNATURE = "bad_signature"
    STALE_SEQ = "stale_seq"
    MISSING_ENTRY = "missing_entry"
    UNKNOWN_ENTRY = "unknown_entry"
    HASH_MISMATCH = "hash_mismatch"
    WRONG_SUBTREE = "wrong_subtree"
    LOOP = "loop"
    TOO_DEEP = "too_deep"
    TOO_MANY_ENTRIES = "too_many_entries"
    TOO_MANY_RECORDS = "too_many_records"
    TXT_TOO_LONG = "txt_too_long"


class DnsDiscoveryError(ProtocolError):
    """An ``enrtree`` URL, entry or tree that is malformed, fails a check or
    exceeds a bound; ``reason`` says which."""

    def __init__(self, reason: StopReason, detail: str):
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class TreeLink:
    """Where a list is and who signs it: an ``enrtree://`` URL, and a link entry."""

    public_key: bytes  # 33-byte compressed secp256k1
    domain: str

    @property
    def url(self) -> str:
        return f"{LINK_PREFIX}{_b32encode(self.public_key)}@{self.domain}"


@dataclass(frozen=True, slots=True)
class RootEntry:
    """``enrtree-root:v1``: the subtree roots, the sequence number, the signature."""

    eroot: str
    lroot: str
    seq: int
    sig: bytes

    def signed_text(self) -> str:
        """The text the signature covers: the root without `` sig=...``."""
        return f"{ROOT_PREFIX} e={self.eroot} l={self.lroot} seq={self.seq}"

    def text(self) -> str:
        return f"{self.signed_text()} sig={_b64encode(self.sig)}"

    def verify(self, public_key: bytes) -> bool:
        """Check r||s against the key, as go-ethereum and nim-dnsdisc do: the
        recovery id is not read, a high-s signature is refused."""
        digest = keccak256(self.signed_text().encode())
        return verify_compact(public_key, self.sig[:64], digest)


@dataclass(frozen=True, slots=True)
class BranchEntry:
    """``enrtree-branch:``: the hashes of the entries below (possibly none)."""

    children: tuple[str, ...]

    def text(self) -> str:
        return BRANCH_PREFIX + ",".join(self.children)


@dataclass(frozen=True, slots=True)
class EnrEntry:
    """``enr:``: a node record, kept as its text."""

    text: str


Entry = BranchEntry | EnrEntry | TreeLink


def subdomain(text: str) -> str:
    """The name of an entry under its list's domain: base32 (unpadded) of the
    first 16 bytes of the keccak256 of its text."""
    return _b32encode(keccak256(_txt_bytes(text))[:HASH_ABBREV_SIZE])


def parse_url(url: str) -> TreeLink:
    """Read ``enrtree://<base32 compressed key>@<domain>``."""
    if not url.startswith(LINK_PREFIX):
        raise _malformed(f"not an {LINK_PREFIX} URL")
    key_text, at, domain = url[len(LINK_PREFIX) :].partition("@")
    if not at or not key_text:
        raise _malformed("link has no public key")
    return TreeLink(_public_key(key_text), _domain(domain))


def parse_root(text: str) -> RootEntry:
    """Read ``enrtree-root:v1 e=<hash> l=<hash> seq=<n> sig=<base64url>``;
    the signature is checked by :meth:`RootEntry.verify`."""
    fields = text.split(" ")
    if len(fields) != 5 or fields[0] != ROOT_PREFIX:
        raise _malformed("root is not 'enrtree-root:v1 e= l= seq= sig='")
    eroot, lroot, seq, sig = (_field(part, name) for part, name in zip(fields[1:], ("e=", "l=", "seq=", "sig=")))
    _hash_bytes(eroot)
    _hash_bytes(lroot)
    signature = _b64decode(sig)
    if len(signature) != SIGNATURE_SIZE:
        raise _malformed(f"root signature is {len(signature)} bytes, not {SIGNATURE_SIZE}")
    return RootEntry(eroot, lroot, _seq(seq), signature)


def parse_entry(text: str) -> Entry:
    """Read a branch, ENR or link entry (the root is :func:`parse_root`'s)."""
    if text.startswith(BRANCH_PREFIX):
        return _parse_branch(text[len(BRANCH_PREFIX) :])
    if text.startswith(ENR_PREFIX):
        return _parse_enr(text)
    if text.startswith(LINK_PREFIX):
        return parse_url(text)
    raise DnsDiscoveryError(StopReason.UNKNOWN_ENTRY, f"unknown entry type {text[:20]!r}")


def build_tree(
    private_key: bytes, domain: str, enrs: Sequence[str], links: Sequence[str], seq: int
) -> tuple[str, dict[str, str]]:
    """Sign a tree of ENR texts (``enr:...``) and links (``enrtree://...``).

    Returns the list's URL and its TXT records, DNS name -> text: the root at
    ``domain``, every other entry at ``<hash>.<domain>``. Leaves are grouped
    into branches of at most 13 hashes, level by level, as go-ethereum's
    ``MakeTree`` does (in the order given, where go-ethereum sorts nodes by
    id); a subtree of one leaf is that leaf, one of none an empty branch.
    """
    link = TreeLink(_signer_key(private_key), _domain(domain))
    if not 0 <= seq <= MAX_SEQ:
        raise _malformed(f"seq {seq} is not a uint64")
    entries: dict[str, str] = {}
    eroot = _build_subtree(_leaves(enrs, EnrEntry), entries)
    lroot = _build_subtree(_leaves(links, TreeLink), entries)
    for text in (eroot, lroot):
        entries[subdomain(text)] = text
    unsigned = RootEntry(subdomain(eroot), subdomain(lroot), seq, b"")
    digest = keccak256(unsigned.signed_text().encode())
    root = replace(unsigned, sig=sign_recoverable(private_key, digest))
    records = {domain: root.text()}
    records.update((f"{name}.{domain}", text) for name, text in entries.items())
    return link.url, records


@dataclass(frozen=True, slots=True)
class _Pending:
    hash: str
    depth: int
    link_tree: bool


class TreeWalk:
    """Reads one list: ask :meth:`next_names`, look each name's TXT records
    up, hand them to :meth:`feed`; repeat until :attr:`done`.

    A driver::

        walk = TreeWalk(parse_url(url))
        while names := walk.next_names():
            for name in names:
                walk.feed(name, await lookup_txt(name))  # [] when none
        count(walk.stop_reason)  # None when the whole tree was read

    Names may be looked up in any order and concurrently. :attr:`enrs` and
    :attr:`links` fill as leaves arrive. On a bad signature, a hash
    mismatch, an unknown or malformed entry, an ENR in the link subtree or
    a link in the ENR subtree, a hash named twice, a bound exceeded or a TXT
    string over 512 bytes, the walk stops: :attr:`error` holds the
    :class:`DnsDiscoveryError`, :meth:`next_names` returns nothing and
    later feeds are ignored. ``min_seq`` refuses a root older than one seen
    before (EIP-1459's sequence-number check).
    """

    def __init__(
        self,
        link: TreeLink,
        *,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        max_depth: int = DEFAULT_MAX_DEPTH,
        max_records: int = DEFAULT_MAX_RECORDS,
        min_seq: int = 0,
    ):
        if max_entries < 1 or max_depth < 1 or max_records < 0:
            raise ValueError("max_entries and max_depth must be positive, max_records not negative")
        self.link = link
        self.max_entries = max_entries
        self.max_depth = max_depth
        self.max_records = max_records
        self.min_seq = min_seq
        self.root: RootEntry | None = None
        self.enrs: list[str] = []
        self.links: list[str] = []
        self.error: DnsDiscoveryError | None = None
        self._root_asked = False
        self._queue: deque[_Pending] = deque()
        self._asked: dict[str, _Pending] = {}
        self._seen: set[bytes] = set()

    @property
    def stop_reason(self) -> StopReason | None:
        return None if self.error is None else self.error.reason

    @property
    def done(self) -> bool:
        """Stopped, or every entry of the tree was read."""
        return self.error is not None or (self._root_fed and not self._queue and not self._asked)

    @property
    def complete(self) -> bool:
        """Every entry of the tree was read and checked."""
        return self.done and self.error is None

    @property
    def _root_fed(self) -> bool:
        return self._root_asked and self.link.domain not in self._asked

    def next_names(self, limit: int | None = None) -> list[str]:
        """DNS names to look up next (each named once), at most ``limit``."""
        if self.error is not None or (limit is not None and limit < 1):
            return []
        if not self._root_asked:
            self._root_asked = True
            self._asked[self.link.domain] = _Pending("", 0, False)
            return [self.link.domain]
        names: list[str] = []
        while self._queue and (limit is None or len(names) < limit):
            pending = self._queue.popleft()
            name = f"{pending.hash}.{self.link.domain}"
            self._asked[name] = pending
            names.append(name)
        return names

    def feed(self, name: str, txt_records: Sequence[str]) -> None:
        """The TXT strings found at ``name`` (empty when none or NXDOMAIN).

        Raises ValueError for a name :meth:`next_names` did not give or that
        was fed already; ignored once the walk has stopped."""
        if isinstance(txt_records, str):
            raise TypeError("txt_records is a sequence of strings, not one string")
        if self.error is not None:
            return
        pending = self._asked.pop(name, None)
        if pending is None:
            raise ValueError(f"{name!r} was not asked for or was fed already")
        try:
            _check_sizes(txt_records)
            if pending.depth == 0:
                self._feed_root(txt_records)
            else:
                self._feed_entry(pending, txt_records)
        except DnsDiscoveryError as exc:
            self._stop(exc)

    def _feed_root(self, txt_records: Sequence[str]) -> None:
        text = next((txt for txt in txt_records if txt.startswith(ROOT_PREFIX)), None)
        if text is None:
            raise DnsDiscoveryError(StopReason.NO_ROOT, f"no {ROOT_PREFIX} record at {self.link.domain}")
        root = parse_root(text)
        if not root.verify(self.link.public_key):
            raise DnsDiscoveryError(StopReason.BAD_SIGNATURE, f"root of {self.link.domain} is not signed by its key")
        if root.seq < self.min_seq:
            raise DnsDiscoveryError(StopReason.STALE_SEQ, f"root seq {root.seq} is below {self.min_seq}")
        self.root = root
        self._enqueue(root.eroot, 1, link_tree=False)
        if root.lroot != root.eroot:  # both are the empty branch in a tree with nothing
            self._enqueue(root.lroot, 1, link_tree=True)

    def _feed_entry(self, pending: _Pending, txt_records: Sequence[str]) -> None:
        entry = parse_entry(_entry_text(pending.hash, txt_records))
        if isinstance(entry, BranchEntry):
            for child in entry.children:
                self._enqueue(child, pending.depth + 1, pending.link_tree)
        elif isinstance(entry, EnrEntry):
            self._collect(self.enrs, entry.text, in_place=not pending.link_tree)
        else:
            self._collect(self.links, entry.url, in_place=pending.link_tree)

    def _enqueue(self, hash_text: str, depth: int, link_tree: bool) -> None:
        if depth > self.max_depth:
            raise DnsDiscoveryError(StopReason.TOO_DEEP, f"entry {hash_text} is {depth} levels deep")
        key = _hash_bytes(hash_text)[:MIN_HASH_SIZE]
        if key in self._seen:
            raise DnsDiscoveryError(StopReason.LOOP, f"hash {hash_text} is named twice")
        if len(self._seen) >= self.max_entries:
            raise DnsDiscoveryError(StopReason.TOO_MANY_ENTRIES, f"more than {self.max_entries} entries")
        self._seen.add(key)
        self._queue.append(_Pending(hash_text, depth, link_tree))

    def _collect(self, into: list[str], text: str, in_place: bool) -> None:
        if not in_place:
            raise DnsDiscoveryError(StopReason.WRONG_SUBTREE, f"{text[:20]!r} is in the other subtree")
        if len(self.enrs) + len(self.links) >= self.max_records:
            raise DnsDiscoveryError(StopReason.TOO_MANY_RECORDS, f"more than {self.max_records} records")
        into.append(text)

    def _stop(self, error: DnsDiscoveryError) -> None:
        self.error = error
        self._queue.clear()
        self._asked.clear()


def _entry_text(hash_text: str, txt_records: Sequence[str]) -> str:
    """The first string of a known type, checked against the hash asked for
    (go-ethereum skips the strings of unknown type)."""
    if not txt_records:
        raise DnsDiscoveryError(StopReason.MISSING_ENTRY, f"no TXT record at {hash_text}")
    known = (BRANCH_PREFIX, ENR_PREFIX, LINK_PREFIX)
    text = next((txt for txt in txt_records if txt.startswith(known)), None)
    if text is None:
        raise DnsDiscoveryError(StopReason.UNKNOWN_ENTRY, f"no entry of a known type at {hash_text}")
    if not keccak256(_txt_bytes(text)).startswith(_hash_bytes(hash_text)):
        raise DnsDiscoveryError(StopReason.HASH_MISMATCH, f"entry at {hash_text} does not hash to its name")
    return text


def _check_sizes(txt_records: Sequence[str]) -> None:
    for txt in txt_records:
        if len(txt) > MAX_TXT_SIZE or len(_txt_bytes(txt)) > MAX_TXT_SIZE:
            raise DnsDiscoveryError(StopReason.TXT_TOO_LONG, f"TXT string over {MAX_TXT_SIZE} bytes")


def _parse_branch(children: str) -> BranchEntry:
    if not children:
        return BranchEntry(())  # an empty subtree
    hashes = tuple(children.split(","))
    for child in hashes:
        _hash_bytes(child)
    return BranchEntry(hashes)


def _parse_enr(text: str) -> EnrEntry:
    if not _b64decode(text[len(ENR_PREFIX) :]):
        raise _malformed("empty node record")
    return EnrEntry(text)


def _build_subtree(texts: list[str], entries: dict[str, str]) -> str:
    """go-ethereum's ``Tree.build``: the text of the subtree's top entry;
    every entry below it goes into ``entries`` (hash -> text)."""
    if len(texts) == 1:
        return texts[0]
    if len(texts) <= MAX_CHILDREN:
        entries.update((subdomain(text), text) for text in texts)
        return BranchEntry(tuple(subdomain(text) for text in texts)).text()
    tops = [_build_subtree(texts[i : i + MAX_CHILDREN], entries) for i in range(0, len(texts), MAX_CHILDREN)]
    entries.update((subdomain(text), text) for text in tops)
    return _build_subtree(tops, entries)


def _leaves(texts: Sequence[str], kind: type[EnrEntry] | type[TreeLink]) -> list[str]:
    leaves = []
    for text in texts:
        entry = parse_entry(text)
        if not isinstance(entry, kind):
            raise _malformed(f"{text[:20]!r} is not a {kind.__name__}")
        leaves.append(entry.url if isinstance(entry, TreeLink) else entry.text)
    if any(len(_txt_bytes(text)) > MAX_TXT_SIZE for text in leaves):
        raise DnsDiscoveryError(StopReason.TXT_TOO_LONG, f"leaf over {MAX_TXT_SIZE} bytes")
    if len(set(leaves)) != len(leaves):
        raise DnsDiscoveryError(StopReason.LOOP, "a leaf is listed twice")
    return leaves


def _signer_key(private_key: bytes) -> bytes:
    try:
        return bytes(private_key_from_bytes(private_key).public_key.format(compressed=True))
    except ProtocolError as exc:
        raise _malformed(str(exc)) from None


def _public_key(text: str) -> bytes:
    raw = _b32decode(text)
    if len(raw) != SECP256K1_COMPRESSED_SIZE:
        raise _malformed(f"public key is {len(raw)} bytes, not {SECP256K1_COMPRESSED_SIZE}")
    try:
        public_key_from_bytes(raw)
    except ProtocolError as exc:
        raise _malformed(str(exc)) from None
    return raw


def _domain(domain: str) -> str:
    if not 0 < len(domain) <= MAX_DOMAIN_SIZE or not all(_LABEL.fullmatch(label) for label in domain.split(".")):
        raise _malformed(f"not a DNS name: {domain[:64]!r}")
    return domain


def _field(part: str, name: str) -> str:
    if not part.startswith(name):
        raise _malformed(f"root has no {name} field")
    return part[len(name) :]


def _seq(text: str) -> int:
    if not _SEQ.fullmatch(text) or int(text) > MAX_SEQ:
        raise _malformed(f"root seq {text[:24]!r} is not a uint64")
    return int(text)


def _hash_bytes(text: str) -> bytes:
    raw = _b32decode(text)
    if not MIN_HASH_SIZE <= len(raw) <= MAX_HASH_SIZE:
        raise _malformed(f"hash {text[:60]!r} is {len(raw)} bytes, not {MIN_HASH_SIZE} to {MAX_HASH_SIZE}")
    return raw


def _b32encode(raw: bytes) -> str:
    return base64.b32encode(raw).decode().rstrip("=")


def _b32decode(text: str) -> bytes:
    """RFC 4648 base32, upper case, unpadded (go-ethereum's b32format)."""
    if not _BASE32.fullmatch(text) or len(text) % 8 in (1, 3, 6):
        raise _malformed(f"not unpadded base32: {text[:60]!r}")
    try:
        return base64.b32decode(text + "=" * (-len(text) % 8))
    except binascii.Error:
        raise _malformed(f"not unpadded base32: {text[:60]!r}") from None


def _b64encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _b64decode(text: str) -> bytes:
    """RFC 4648 URL-safe base64, unpadded (go-ethereum's b64format)."""
    if not _BASE64URL.fullmatch(text) or len(text) % 4 == 1:
        raise _malformed(f"not unpadded base64url: {text[:60]!r}")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except binascii.Error:
        raise _malformed(f"not unpadded base64url: {text[:60]!r}") from None


def _txt_bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _malformed(detail: str) -> DnsDiscoveryError:
    return DnsDiscoveryError(StopReason.MALFORMED, detail)
