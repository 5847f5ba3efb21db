import base64
import os

import coincurve
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wakustore.protocols.crypto import keccak256, sign_recoverable
from wakustore.protocols.dns_discovery import (
    MAX_CHILDREN,
    MAX_TXT_SIZE,
    BranchEntry,
    DnsDiscoveryError,
    EnrEntry,
    RootEntry,
    StopReason,
    TreeLink,
    TreeWalk,
    build_tree,
    parse_entry,
    parse_root,
    parse_url,
    subdomain,
)
from wakustore.protocols.errors import ProtocolError

# The example tree of EIP-1459 ("DNS Record Structure"), which go-ethereum's
# p2p/dnsdisc/client_test.go (TestClientSyncTree) syncs under the domain "n".
# It is signed by go-ethereum's test key (signingKeySeed), whose URL key is
# AKPYQ...; that key's uncompressed form is the 0x049f88... the EIP prints
# for its example URL, whose key AM5FC... is another one (the example's link).
EIP_SIGNER_URL = "enrtree://AKPYQIUQIL7PSIACI32J7FGZW56E5FKHEFCCOFHILBIMW3M6LWXS2@n"
EIP_EXAMPLE_URL = "enrtree://AM5FCQLWIZX2QFPNJAP7VUERCCRNGRHWZG3YYHIUV7BVDQ5FDPRT2@nodes.example.org"
EIP_PRINTED_KEY = bytes.fromhex(
    "049f88229042fef9200246f49f94d9b77c4e954721442714e85850cb6d9e5daf2d"
    "880ea0e53cb3ac1a75f9923c2726a4f941f7d326781baa6380754a360de5c2b6"
)
EIP_ROOT = (
    "enrtree-root:v1 e=JWXYDBPXYWG6FX3GMDIBFA6CJ4 l=C7HRFPF3BLGF3YR4DY5KX3SMBE seq=1 "
    "sig=o908WmNp7LibOfPsr4btQwatZJ5URBr2ZAuxvK4UWHlsB9sUOTJQaGAlLPVAhM__XJesCHxLISo94z5Z2a463gA"
)
EIP_LINK = "enrtree://AM5FCQLWIZX2QFPNJAP7VUERCCRNGRHWZG3YYHIUV7BVDQ5FDPRT2@morenodes.example.org"
EIP_BRANCH = "enrtree-branch:2XS2367YHAXJFGLZHVAWLQD4ZY,H4FHT4B454P6UXFD7JCYQ5PWDY,MHTDO6TMUBRIA2XWG5LUDACK24"
EIP_ENRS = [
    "enr:-HW4QOFzoVLaFJnNhbgMoDXPnOvcdVuj7pDpqRvh6BRDO68aVi5ZcjB3vzQRZH2IcLBGHzo8uUN3snqmgTiE56CH3AMBgmlkgnY0iXNlY3AyNTZrMaECC2_24YYkYHEgdzxlSNKQEnHhuNAbNlMlWJxrJxbAFvA",
    "enr:-HW4QAggRauloj2SDLtIHN1XBkvhFZ1vtf1raYQp9TBW2RD5EEawDzbtSmlXUfnaHcvwOizhVYLtr7e6vw7NAf6mTuoCgmlkgnY0iXNlY3AyNTZrMaECjrXI8TLNXU0f8cthpAMxEshUyQlK-AM0PW2wfrnacNI",
    "enr:-HW4QLAYqmrwllBEnzWWs7I5Ev2IAs7x_dZlbYdRdMUx5EyKHDXp7AV5CkuPGUPdvbv1_Ms1CPfhcGCvSElSosZmyoqAgmlkgnY0iXNlY3AyNTZrMaECriawHKWdDRk2xeZkrOXBQ0dfMFLHY4eENZwdufn1S1o",
]
EIP_RECORDS = {
    "n": EIP_ROOT,
    "C7HRFPF3BLGF3YR4DY5KX3SMBE.n": EIP_LINK,
    "JWXYDBPXYWG6FX3GMDIBFA6CJ4.n": EIP_BRANCH,
    "2XS2367YHAXJFGLZHVAWLQD4ZY.n": EIP_ENRS[0],
    "H4FHT4B454P6UXFD7JCYQ5PWDY.n": EIP_ENRS[1],
    "MHTDO6TMUBRIA2XWG5LUDACK24.n": EIP_ENRS[2],
}

# nim-dnsdisc tests/test_builder.nim ("Sign tree"): this key signs the
# EIP's example root (e=JWXY... l=C7HR... seq=1) into this signature.
NIM_KEY = bytes.fromhex("58d23b55bc9cdce1f18c2500f40ff4ab7245df9a89505e9b1fa4851f623d241d")
NIM_SIG = "8BGq3_ZasQUPvDyU7cqBpsHVjn4CP5GsFf7Xf9M1bJARCXII3SrD7e_I8Q6qw9oLItHapevgFlfPfwhqPXFRrAA"

KEY = bytes.fromhex("11" * 32)
OTHER_KEY = bytes.fromhex("22" * 32)
DOMAIN = "nodes.example.org"
SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


def fake_enrs(count, seed=0):
    """ENR-shaped texts: the walk does not decode records."""
    return [
        "enr:" + base64.urlsafe_b64encode(keccak256(b"%d-%d" % (seed, i)) * 4).decode().rstrip("=")
        for i in range(count)
    ]


def fake_links(count):
    keys = [coincurve.PrivateKey(keccak256(b"link %d" % i)).public_key.format() for i in range(count)]
    return [TreeLink(key, f"list{i}.example.org").url for i, key in enumerate(keys)]


def walk(url, records, **bounds):
    """Drive a walk from a name -> TXT map, as a DNS client would."""
    tree_walk = TreeWalk(parse_url(url), **bounds)
    while names := tree_walk.next_names():
        for name in names:
            tree_walk.feed(name, [records[name]] if name in records else [])
    assert tree_walk.done
    return tree_walk


def signed_root(key, eroot, lroot, seq=1):
    unsigned = RootEntry(eroot, lroot, seq, b"")
    sig = sign_recoverable(key, keccak256(unsigned.signed_text().encode()))
    return RootEntry(eroot, lroot, seq, sig).text()


def handmade_tree(entries, eroot, lroot, key=KEY):
    """A tree from its entry texts, signed with ``key``: for trees
    build_tree never writes."""
    records = {DOMAIN: signed_root(key, eroot, lroot)}
    records.update((f"{subdomain(text)}.{DOMAIN}", text) for text in entries)
    url = TreeLink(coincurve.PrivateKey(key).public_key.format(), DOMAIN).url
    return url, records


def depth(records, domain):
    """Levels below the root, counted from the ENR subtree's top entry."""
    root = parse_root(records[domain])

    def below(hash_text):
        entry = parse_entry(records[f"{hash_text}.{domain}"])
        if isinstance(entry, BranchEntry) and entry.children:
            return 1 + max(below(child) for child in entry.children)
        return 1

    return below(root.eroot)


# --- the published vectors ------------------------------------------------


def test_eip_example_url_is_read():
    link = parse_url(EIP_EXAMPLE_URL)
    assert link.domain == "nodes.example.org"
    assert link.public_key.hex() == "033a514176466fa815ed481ffad09110a2d344f6c9b78c1d14afc351c3a51be33d"
    assert link.url == EIP_EXAMPLE_URL


def test_the_key_the_eip_prints_is_the_signer_of_its_example_tree():
    signer = parse_url(EIP_SIGNER_URL).public_key
    assert coincurve.PublicKey(EIP_PRINTED_KEY).format() == signer
    assert parse_url(EIP_EXAMPLE_URL).public_key != signer


def test_eip_example_entries_hash_to_their_names():
    for name, text in EIP_RECORDS.items():
        if name != "n":
            assert subdomain(text) == name.split(".")[0]


def test_eip_example_root_is_parsed_and_verified():
    root = parse_root(EIP_ROOT)
    assert (root.eroot, root.lroot, root.seq) == ("JWXYDBPXYWG6FX3GMDIBFA6CJ4", "C7HRFPF3BLGF3YR4DY5KX3SMBE", 1)
    assert len(root.sig) == 65
    assert root.text() == EIP_ROOT
    assert root.verify(parse_url(EIP_SIGNER_URL).public_key)
    assert not root.verify(parse_url(EIP_EXAMPLE_URL).public_key)


def test_eip_example_tree_is_walked():
    # go-ethereum TestClientSyncTree: three nodes, one link, seq 1.
    result = walk(EIP_SIGNER_URL, EIP_RECORDS)
    assert result.complete and result.stop_reason is None
    assert result.enrs == EIP_ENRS
    assert result.links == [EIP_LINK]
    assert result.root is not None and result.root.seq == 1


def test_eip_example_tree_under_the_eip_example_url_fails_its_signature():
    records = {name.replace(".n", f".{DOMAIN}") if name != "n" else DOMAIN: v for name, v in EIP_RECORDS.items()}
    result = walk(EIP_EXAMPLE_URL, records)
    assert result.stop_reason is StopReason.BAD_SIGNATURE
    assert result.enrs == [] and result.links == []


def test_build_tree_reproduces_the_eip_example_and_nim_dnsdisc_signature():
    url, records = build_tree(NIM_KEY, DOMAIN, EIP_ENRS, [EIP_LINK], seq=1)
    expected = {f"{name[:-2]}.{DOMAIN}": text for name, text in EIP_RECORDS.items() if name != "n"}
    expected[DOMAIN] = EIP_ROOT.split(" sig=")[0] + " sig=" + NIM_SIG
    assert records == expected
    assert parse_url(url).public_key == coincurve.PrivateKey(NIM_KEY).public_key.format()
    assert walk(url, records).enrs == EIP_ENRS


def test_go_ethereum_bad_node_vector_stops_on_the_malformed_record():
    # go-ethereum TestClientSyncTreeBadNode: the ENR root is "enr:-----".
    records = {
        "n": "enrtree-root:v1 e=INDMVBZEEQ4ESVYAKGIYU74EAA l=C7HRFPF3BLGF3YR4DY5KX3SMBE seq=3 sig=Vl3AmunLur0JZ3sIyJPSH6A3Vvdp4F40jWQeCmkIhmcgwE4VC5U9wpK8C_uL_CMY29fd6FAhspRvq2z_VysTLAA",
        "C7HRFPF3BLGF3YR4DY5KX3SMBE.n": EIP_LINK,
        "INDMVBZEEQ4ESVYAKGIYU74EAA.n": "enr:-----",
    }
    result = walk(EIP_SIGNER_URL, records)
    assert result.root is not None and result.root.seq == 3
    assert result.stop_reason is StopReason.MALFORMED


def test_go_ethereum_parse_root_vectors():
    # go-ethereum p2p/dnsdisc/tree_test.go TestParseRoot.
    sig = "sig=N-YY6UB9xD0hFx1Gmnt7v0RfSxch5tKyry2SRDoLx7B4GfPXagwLxQqyf7gAMvApFn_ORwZQekMWa_pXrcGCtw"
    with pytest.raises(DnsDiscoveryError):  # no l=
        parse_root(f"enrtree-root:v1 e=TO4Q75OQ2N7DX4EOOR7X66A6OM seq=3 {sig}")
    with pytest.raises(DnsDiscoveryError):  # a 64-byte signature
        parse_root(f"enrtree-root:v1 e=TO4Q75OQ2N7DX4EOOR7X66A6OM l=TO4Q75OQ2N7DX4EOOR7X66A6OM seq=3 {sig}")
    root = parse_root(
        "enrtree-root:v1 e=QFT4PBCRX4XQCV3VUYJ6BTCEPU l=JGUFMSAGI7KZYB3P7IZW4S5Y3A seq=3 "
        "sig=3FmXuVwpa8Y7OstZTx9PIb1mt8FrW7VpDOFv4AaGCsZ2EIHmhraWhe4NxYhQDlw5MjeFXYMbJjsPeKlHzmJREQE"
    )
    assert root == RootEntry(
        "QFT4PBCRX4XQCV3VUYJ6BTCEPU",
        "JGUFMSAGI7KZYB3P7IZW4S5Y3A",
        3,
        bytes.fromhex(
            "dc5997b95c296bc63b3acb594f1f4f21bd66b7c16b5bb5690ce16fe006860ac6"
            "761081e686b69685ee0dc588500e5c393237855d831b263b0f78a947ce62511101"
        ),
    )


@pytest.mark.parametrize(
    "text, expected",
    [
        ("enrtree-branch:", BranchEntry(())),
        ("enrtree-branch:AAAAAAAAAAAAAAAAAAAA", BranchEntry(("AAAAAAAAAAAAAAAAAAAA",))),
        (
            "enrtree-branch:AAAAAAAAAAAAAAAAAAAA,BBBBBBBBBBBBBBBBBBBB",
            BranchEntry(("AAAAAAAAAAAAAAAAAAAA", "BBBBBBBBBBBBBBBBBBBB")),
        ),
        (
            "enrtree://AKPYQIUQIL7PSIACI32J7FGZW56E5FKHEFCCOFHILBIMW3M6LWXS2@nodes.example.org",
            TreeLink(coincurve.PublicKey(EIP_PRINTED_KEY).format(), "nodes.example.org"),
        ),
        (
            "enr:-HW4QES8QIeXTYlDzbfr1WEzE-XKY4f8gJFJzjJL-9D7TC9lJb4Z3JPRRz1lP4pL_N_QpT6rGQjAU9Apnc-C1iMP36OAgmlkgnY0iXNlY3AyNTZrMaED5IdwfMxdmR8W37HqSFdQLjDkIwBd4Q_MjxgZifgKSdM",
            EnrEntry(
                "enr:-HW4QES8QIeXTYlDzbfr1WEzE-XKY4f8gJFJzjJL-9D7TC9lJb4Z3JPRRz1lP4pL_N_QpT6rGQjAU9Apnc-C1iMP36OAgmlkgnY0iXNlY3AyNTZrMaED5IdwfMxdmR8W37HqSFdQLjDkIwBd4Q_MjxgZifgKSdM"
            ),
        ),
    ],
)
def test_go_ethereum_parse_entry_vectors(text, expected):
    # go-ethereum p2p/dnsdisc/tree_test.go TestParseEntry, accepted entries.
    assert parse_entry(text) == expected


@pytest.mark.parametrize(
    "text, reason",
    [
        ("enrtree-branch:1,2", StopReason.MALFORMED),
        ("enrtree-branch:" + "A" * 53, StopReason.MALFORMED),  # 33 bytes
        ("enrtree://nodes.example.org", StopReason.MALFORMED),
        ("enrtree://AP62DT7WOTEQZGQZOU474PP3KMEGVTTE7A7NPRXKX3DUD57@nodes.example.org", StopReason.MALFORMED),
        ("enrtree://AP62DT7WONEQZGQZOU474PP3KMEGVTTE7A7NPRXKX3DUD57TQHGIA@nodes.example.org", StopReason.MALFORMED),
        (
            "enr:-HW4QLZHjM4vZXkbp-5xJoHsKSbE7W39FPC8283X-y8oHcHPTnDDlIlzL5ArvDUlHZVDPgmFASrh7cWgLOLxj4wprRkHgmlkgnY0iXNlY3AyNTZrMaEC3t2jLMhDpCDX5mbSEwDn4L3iUfyXzoO8G28XvjGRkrAg=",
            StopReason.MALFORMED,
        ),
        ("", StopReason.UNKNOWN_ENTRY),
        ("foo", StopReason.UNKNOWN_ENTRY),
        ("enrtree", StopReason.UNKNOWN_ENTRY),
        ("enrtree-x=", StopReason.UNKNOWN_ENTRY),
    ],
)
def test_go_ethereum_refused_entry_vectors(text, reason):
    # go-ethereum p2p/dnsdisc/tree_test.go TestParseEntry, refused entries.
    with pytest.raises(DnsDiscoveryError) as info:
        parse_entry(text)
    assert info.value.reason is reason


# --- URLs, entries -----------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "AKPYQIUQIL7PSIACI32J7FGZW56E5FKHEFCCOFHILBIMW3M6LWXS2@n",  # no scheme
        "enrtree://@n",
        "enrtree://AKPYQIUQIL7PSIACI32J7FGZW56E5FKHEFCCOFHILBIMW3M6LWXS2@",
        "enrtree://AKPYQIUQIL7PSIACI32J7FGZW56E5FKHEFCCOFHILBIMW3M6LWXS2",
        "enrtree://akpyqiuqil7psiaci32j7fgzw56e5fkhefcocfhilbimw3m6lwxs2@n",  # lower case
        "enrtree://AKPYQIUQIL7PSIACI32J7FGZW56E5FKHEFCCOFHILBIMW3M6LWXS2===@n",  # padded
        "enrtree://AKPYQIUQIL7PSIACI32J7FGZW56E5FKHEFCCOFHILBIMW3M6LWXS2@a..b",
        "enrtree://AKPYQIUQIL7PSIACI32J7FGZW56E5FKHEFCCOFHILBIMW3M6LWXS2@a b",
        "enrtree://AKPYQIUQIL7PSIACI32J7FGZW56E5FKHEFCCOFHILBIMW3M6LWXS2@" + "a" * 64,
        "enrtree://AKPYQIUQIL7PSIACI32J7FGZW56E5FKHEFCCOFHILBIMW3M6LWXS2@nödes.example.org",
        "enrtree://" + "A" * 53 + "@n",  # 33 bytes, not a point
        "https://example.org",
        "",
    ],
)
def test_malformed_urls_are_refused(url):
    with pytest.raises(DnsDiscoveryError) as info:
        parse_url(url)
    assert info.value.reason is StopReason.MALFORMED
    assert isinstance(info.value, ProtocolError)


@pytest.mark.parametrize(
    "text",
    [
        EIP_ROOT + " ",
        EIP_ROOT.replace(" l=", "  l="),
        EIP_ROOT.replace("seq=1", "seq=-1"),
        EIP_ROOT.replace("seq=1", "seq=x"),
        EIP_ROOT.replace("seq=1", f"seq={2**64}"),
        EIP_ROOT.replace("enrtree-root:v1", "enrtree-root:v2"),
        EIP_ROOT.replace("e=JWXYDBPXYWG6FX3GMDIBFA6CJ4", "e=JWXY"),
        EIP_ROOT.replace("sig=o908", "sig=o9=8"),
        EIP_ROOT + "A",
        EIP_ROOT.replace(" sig=", " s="),
        "enrtree-root:v1",
    ],
)
def test_malformed_roots_are_refused(text):
    with pytest.raises(DnsDiscoveryError) as info:
        parse_root(text)
    assert info.value.reason is StopReason.MALFORMED


def test_empty_or_padded_records_are_refused():
    for text in ("enr:", "enr:AAA=", "enr:a+b", "enrtree-branch:AAAAAAAAAAAAAAAAAAAA,"):
        with pytest.raises(DnsDiscoveryError):
            parse_entry(text)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=600))
def test_garbage_text_raises_only_dns_discovery_errors(text):
    for parse in (parse_url, parse_root, parse_entry):
        try:
            parse(text)
        except DnsDiscoveryError:
            pass
    for prefixed in ("enrtree://" + text, "enrtree-branch:" + text, "enr:" + text, "enrtree-root:v1 " + text):
        for parse in (parse_url, parse_root, parse_entry):
            try:
                parse(prefixed)
            except DnsDiscoveryError:
                pass


# --- round trips ---------------------------------------------------------------


@pytest.mark.parametrize("count, levels", [(1, 1), (13, 2), (14, 3), (200, 4)])
def test_build_then_walk(count, levels):
    enrs = fake_enrs(count)
    url, records = build_tree(KEY, DOMAIN, enrs, [], seq=7)
    result = walk(url, records)
    assert result.complete
    assert sorted(result.enrs) == sorted(enrs)
    assert result.links == []
    assert result.root is not None and result.root.seq == 7
    assert depth(records, DOMAIN) == levels
    # every entry is read once: the records hold nothing the walk skipped
    assert len(records) == 1 + len(result.enrs) + sum(
        isinstance(parse_entry(text), BranchEntry) for name, text in records.items() if name != DOMAIN
    )


def test_branches_hold_at_most_13_hashes_and_fit_370_bytes():
    url, records = build_tree(KEY, DOMAIN, fake_enrs(200), fake_links(30), seq=1)
    branches = [parse_entry(text) for text in records.values() if text.startswith("enrtree-branch:")]
    assert max(len(branch.children) for branch in branches) == MAX_CHILDREN
    assert all(len(branch.text()) <= 370 for branch in branches)
    assert all(len(text.encode()) <= MAX_TXT_SIZE for text in records.values())


@pytest.mark.parametrize("enr_count, link_count", [(0, 1), (3, 1), (14, 2), (200, 30)])
def test_build_then_walk_with_links(enr_count, link_count):
    enrs, links = fake_enrs(enr_count), fake_links(link_count)
    url, records = build_tree(KEY, DOMAIN, enrs, links, seq=1)
    result = walk(url, records)
    assert result.complete
    assert sorted(result.enrs) == sorted(enrs)
    assert sorted(result.links) == sorted(links)


def test_an_empty_tree_names_the_empty_branch_twice_and_is_walked():
    url, records = build_tree(KEY, DOMAIN, [], [], seq=1)
    root = parse_root(records[DOMAIN])
    assert root.eroot == root.lroot == subdomain("enrtree-branch:")
    result = walk(url, records)
    assert result.complete and result.enrs == [] and result.links == []


def test_the_url_is_the_signers_key_and_the_domain():
    url, _ = build_tree(KEY, DOMAIN, fake_enrs(1), [], seq=1)
    assert parse_url(url) == TreeLink(coincurve.PrivateKey(KEY).public_key.format(), DOMAIN)


@pytest.mark.parametrize(
    "private_key, domain, enrs, links, seq",
    [
        (b"\x00" * 32, DOMAIN, [], [], 1),
        (b"\x01" * 31, DOMAIN, [], [], 1),
        (KEY, "bad domain", [], [], 1),
        (KEY, DOMAIN, ["enr:"], [], 1),
        (KEY, DOMAIN, ["-HW4QOFzoVLa"], [], 1),
        (KEY, DOMAIN, [EIP_LINK], [], 1),
        (KEY, DOMAIN, [], [EIP_ENRS[0]], 1),
        (KEY, DOMAIN, [EIP_ENRS[0], EIP_ENRS[0]], [], 1),
        (KEY, DOMAIN, ["enr:" + "A" * 600], [], 1),
        (KEY, DOMAIN, [], [], -1),
        (KEY, DOMAIN, [], [], 2**64),
    ],
)
def test_build_tree_refuses_bad_input(private_key, domain, enrs, links, seq):
    with pytest.raises(DnsDiscoveryError):
        build_tree(private_key, domain, enrs, links, seq)


# --- refusals ----------------------------------------------------------------


def test_wrong_key_in_url_fails_the_signature():
    url, records = build_tree(KEY, DOMAIN, fake_enrs(5), [], seq=1)
    wrong = TreeLink(coincurve.PrivateKey(OTHER_KEY).public_key.format(), DOMAIN).url
    result = walk(wrong, records)
    assert result.stop_reason is StopReason.BAD_SIGNATURE
    assert result.root is None and result.enrs == []


def test_tampered_root_signature_or_fields_fail_the_signature():
    url, records = build_tree(KEY, DOMAIN, fake_enrs(5), [], seq=1)
    root = parse_root(records[DOMAIN])
    flipped = bytes([root.sig[0] ^ 1]) + root.sig[1:]
    for tampered in (
        RootEntry(root.eroot, root.lroot, root.seq, flipped).text(),
        RootEntry(root.eroot, root.lroot, root.seq + 1, root.sig).text(),
        RootEntry(root.lroot, root.eroot, root.seq, root.sig).text(),
    ):
        result = walk(url, {**records, DOMAIN: tampered})
        assert result.stop_reason is StopReason.BAD_SIGNATURE


def test_high_s_twin_of_the_signature_is_refused():
    url, records = build_tree(KEY, DOMAIN, fake_enrs(2), [], seq=1)
    root = parse_root(records[DOMAIN])
    s = int.from_bytes(root.sig[32:64], "big")
    twin = root.sig[:32] + (SECP256K1_N - s).to_bytes(32, "big") + bytes([root.sig[64] ^ 1])
    assert not RootEntry(root.eroot, root.lroot, root.seq, twin).verify(parse_url(url).public_key)


def test_recovery_id_is_not_read():
    url, records = build_tree(KEY, DOMAIN, fake_enrs(2), [], seq=1)
    root = parse_root(records[DOMAIN])
    assert RootEntry(root.eroot, root.lroot, root.seq, root.sig[:64] + b"\x1b").verify(parse_url(url).public_key)


def test_tampered_entry_is_a_hash_mismatch():
    enrs = fake_enrs(20)
    url, records = build_tree(KEY, DOMAIN, enrs, [], seq=1)
    name = next(name for name, text in records.items() if text == enrs[5])
    result = walk(url, {**records, name: enrs[5][:-2] + "AA"})
    assert result.stop_reason is StopReason.HASH_MISMATCH
    assert set(result.enrs) <= set(enrs)
    assert enrs[5] not in result.enrs


def test_entry_put_under_another_name_is_a_hash_mismatch():
    enrs = fake_enrs(3)
    url, records = build_tree(KEY, DOMAIN, enrs, [], seq=1)
    names = [name for name, text in records.items() if text in enrs]
    swapped = {**records, names[0]: records[names[1]], names[1]: records[names[0]]}
    assert walk(url, swapped).stop_reason is StopReason.HASH_MISMATCH


def test_a_hash_named_twice_is_a_loop():
    # A branch cannot name itself or an ancestor (its hash would be a fixed
    # point of keccak256); what a signer can publish is a hash named twice.
    enr = fake_enrs(1)[0]
    twice = f"enrtree-branch:{subdomain(enr)},{subdomain(enr)}"
    url, records = handmade_tree([twice, enr, "enrtree-branch:"], subdomain(twice), subdomain("enrtree-branch:"))
    assert walk(url, records).stop_reason is StopReason.LOOP


def test_a_branch_naming_the_other_subtree_root_is_a_loop():
    link = fake_links(1)[0]
    branch = f"enrtree-branch:{subdomain(link)}"
    url, records = handmade_tree([branch, link], subdomain(branch), subdomain(link))
    assert walk(url, records).stop_reason is StopReason.LOOP


def test_a_branch_naming_itself_stops_on_its_hash():
    # A resolver answering a name with a branch that names that name.
    url, records = build_tree(KEY, DOMAIN, fake_enrs(3), [], seq=1)
    tree_walk = TreeWalk(parse_url(url))
    tree_walk.feed(*_answer(tree_walk, records))
    first = tree_walk.next_names()[0]
    tree_walk.feed(first, [f"enrtree-branch:{first.split('.')[0]}"])
    assert tree_walk.stop_reason is StopReason.HASH_MISMATCH


def test_a_hash_and_its_12_byte_prefix_name_the_same_entry():
    # go-ethereum accepts hashes of 12 to 32 bytes, a prefix of the keccak256.
    enr = fake_enrs(1)[0]
    short = subdomain(enr)[:20]  # 12 bytes and 4 bits
    assert parse_entry(f"enrtree-branch:{short}") == BranchEntry((short,))
    alone = f"enrtree-branch:{short}"
    url, records = handmade_tree([alone, enr, "enrtree-branch:"], subdomain(alone), subdomain("enrtree-branch:"))
    records[f"{short}.{DOMAIN}"] = enr
    assert walk(url, records).enrs == [enr]
    both = f"enrtree-branch:{subdomain(enr)},{short}"
    url, records = handmade_tree([both, enr, "enrtree-branch:"], subdomain(both), subdomain("enrtree-branch:"))
    assert walk(url, records).stop_reason is StopReason.LOOP


def _answer(tree_walk, records):
    (name,) = tree_walk.next_names()
    return name, [records[name]]


def test_too_deep_stops():
    url, records = build_tree(KEY, DOMAIN, fake_enrs(14), [], seq=1)  # 3 levels
    assert walk(url, records, max_depth=3).complete
    result = walk(url, records, max_depth=2)
    assert result.stop_reason is StopReason.TOO_DEEP


def test_too_many_entries_stops_and_keeps_what_it_read():
    enrs = fake_enrs(200)
    url, records = build_tree(KEY, DOMAIN, enrs, [], seq=1)
    result = walk(url, records, max_entries=50)
    assert result.stop_reason is StopReason.TOO_MANY_ENTRIES
    assert set(result.enrs) <= set(enrs)


def test_too_many_records_stops_at_the_bound():
    enrs, links = fake_enrs(40), fake_links(5)
    url, records = build_tree(KEY, DOMAIN, enrs, links, seq=1)
    result = walk(url, records, max_records=10)
    assert result.stop_reason is StopReason.TOO_MANY_RECORDS
    assert len(result.enrs) + len(result.links) == 10
    assert set(result.enrs) <= set(enrs) and set(result.links) <= set(links)
    assert walk(url, records, max_records=45).complete


def test_oversized_txt_stops():
    url, records = build_tree(KEY, DOMAIN, fake_enrs(3), [], seq=1)
    result = walk(url, {**records, DOMAIN: records[DOMAIN] + " " + "x" * MAX_TXT_SIZE})
    assert result.stop_reason is StopReason.TXT_TOO_LONG
    tree_walk = TreeWalk(parse_url(url))
    tree_walk.feed(*_answer(tree_walk, records))
    eroot = tree_walk.next_names()[0]
    tree_walk.feed(eroot, [records[eroot], "é" * 300])  # 300 characters, 600 bytes
    assert tree_walk.stop_reason is StopReason.TXT_TOO_LONG


def test_txt_of_512_bytes_is_taken():
    enr = "enr:" + "A" * (MAX_TXT_SIZE - 4)
    url, records = build_tree(KEY, DOMAIN, [enr], [], seq=1)
    assert walk(url, records).enrs == [enr]


def test_stale_root_is_refused():
    url, records = build_tree(KEY, DOMAIN, fake_enrs(3), [], seq=5)
    assert walk(url, records, min_seq=5).complete
    assert walk(url, records, min_seq=6).stop_reason is StopReason.STALE_SEQ


def test_enr_in_link_subtree_and_link_in_enr_subtree_are_refused():
    enr, link = fake_enrs(1)[0], fake_links(1)[0]
    url, records = handmade_tree([enr, link], subdomain(link), subdomain(enr))
    assert walk(url, records).stop_reason is StopReason.WRONG_SUBTREE


def test_unknown_entry_type_under_a_matching_hash_is_refused():
    odd = "enrtree=AAAAAAAAAAAAAAAAAAAA"  # the pre-v1 go-ethereum branch form
    url, records = handmade_tree([odd, "enrtree-branch:"], subdomain(odd), subdomain("enrtree-branch:"))
    assert walk(url, records).stop_reason is StopReason.UNKNOWN_ENTRY


@pytest.mark.parametrize(
    "root_answer, reason",
    [
        ([], StopReason.NO_ROOT),
        (["v=spf1 -all"], StopReason.NO_ROOT),
        (["enrtree-root:v1 garbage"], StopReason.MALFORMED),
    ],
)
def test_garbage_root_answers(root_answer, reason):
    url, _ = build_tree(KEY, DOMAIN, fake_enrs(1), [], seq=1)
    tree_walk = TreeWalk(parse_url(url))
    (name,) = tree_walk.next_names()
    tree_walk.feed(name, root_answer)
    assert tree_walk.done and tree_walk.stop_reason is reason
    assert tree_walk.next_names() == []


@pytest.mark.parametrize(
    "answer, reason",
    [
        ([], StopReason.MISSING_ENTRY),
        (["v=spf1 -all", "hello"], StopReason.UNKNOWN_ENTRY),
        (["enr:garbage"], StopReason.HASH_MISMATCH),
        (["\udcff" * 10], StopReason.UNKNOWN_ENTRY),
    ],
)
def test_garbage_entry_answers(answer, reason):
    url, records = build_tree(KEY, DOMAIN, fake_enrs(3), [], seq=1)
    tree_walk = TreeWalk(parse_url(url))
    tree_walk.feed(*_answer(tree_walk, records))
    first, *_ = tree_walk.next_names()
    tree_walk.feed(first, answer)
    assert tree_walk.stop_reason is reason
    assert isinstance(tree_walk.error, DnsDiscoveryError) and tree_walk.error.reason is reason


def test_root_is_found_among_other_txt_records_and_unknown_strings_are_skipped():
    enrs = fake_enrs(3)
    url, records = build_tree(KEY, DOMAIN, enrs, [], seq=1)
    tree_walk = TreeWalk(parse_url(url))
    while names := tree_walk.next_names():
        for name in names:
            tree_walk.feed(name, ["v=spf1 -all", records[name], "google-site-verification=x"])
    assert tree_walk.complete and sorted(tree_walk.enrs) == sorted(enrs)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.text(max_size=80), max_size=3), min_size=1, max_size=8), st.integers(0, 7))
def test_walk_never_raises_on_garbage(answers, tamper_at):
    enrs, links = fake_enrs(20), fake_links(2)
    url, records = build_tree(KEY, DOMAIN, enrs, links, seq=1)
    tree_walk = TreeWalk(parse_url(url), max_entries=100, max_records=100)
    fed = 0
    while names := tree_walk.next_names():
        for name in names:
            garbage = answers[fed % len(answers)] if fed >= tamper_at else None
            tree_walk.feed(name, garbage if garbage is not None else [records[name]])
            fed += 1
    assert tree_walk.done
    assert set(tree_walk.enrs) <= set(enrs) and set(tree_walk.links) <= set(links)


# --- the walk's API ---------------------------------------------------------------


def test_names_come_out_once_and_limit_bounds_them():
    url, records = build_tree(KEY, DOMAIN, fake_enrs(200), [], seq=1)
    tree_walk = TreeWalk(parse_url(url))
    assert tree_walk.next_names(limit=0) == []
    assert tree_walk.next_names() == [DOMAIN]
    assert tree_walk.next_names() == []  # the root is in flight
    assert not tree_walk.done
    tree_walk.feed(DOMAIN, [records[DOMAIN]])
    asked = set()
    while not tree_walk.done:
        batch = tree_walk.next_names(limit=3)
        assert 1 <= len(batch) <= 3 and not asked & set(batch)
        asked.update(batch)
        for name in reversed(batch):  # any order
            tree_walk.feed(name, [records[name]])
    assert tree_walk.complete and len(tree_walk.enrs) == 200
    assert asked == set(records) - {DOMAIN}


def test_feeding_a_name_not_asked_or_twice_is_a_caller_error():
    url, records = build_tree(KEY, DOMAIN, fake_enrs(2), [], seq=1)
    tree_walk = TreeWalk(parse_url(url))
    with pytest.raises(ValueError):
        tree_walk.feed(DOMAIN, [records[DOMAIN]])
    tree_walk.feed(*_answer(tree_walk, records))
    with pytest.raises(ValueError):
        tree_walk.feed(DOMAIN, [records[DOMAIN]])
    with pytest.raises(TypeError):
        tree_walk.feed(tree_walk.next_names()[0], records[DOMAIN])


def test_feeds_after_a_stop_are_ignored():
    url, records = build_tree(KEY, DOMAIN, fake_enrs(30), [], seq=1)
    tree_walk = TreeWalk(parse_url(url))
    tree_walk.feed(*_answer(tree_walk, records))
    names = tree_walk.next_names()
    tree_walk.feed(names[0], [])
    assert tree_walk.stop_reason is StopReason.MISSING_ENTRY
    tree_walk.feed(names[1], [records[names[1]]])
    tree_walk.feed("anything", [])
    assert tree_walk.next_names() == [] and tree_walk.done and not tree_walk.complete


@pytest.mark.parametrize("bounds", [{"max_entries": 0}, {"max_depth": 0}, {"max_records": -1}])
def test_bounds_must_be_sane(bounds):
    with pytest.raises(ValueError):
        TreeWalk(parse_url(EIP_SIGNER_URL), **bounds)


def test_error_carries_its_reason():
    error = DnsDiscoveryError(StopReason.LOOP, "hash named twice")
    assert isinstance(error, ProtocolError)
    assert error.reason is StopReason.LOOP and str(error) == "loop: hash named twice"
    assert StopReason.TXT_TOO_LONG.value == "txt_too_long"


def test_random_keys_round_trip():
    for _ in range(3):
        key = os.urandom(32)
        url, records = build_tree(key, "a.b", fake_enrs(5, seed=1), fake_links(1), seq=2**64 - 1)
        result = walk(url, records)
        assert result.complete and result.root is not None and result.root.seq == 2**64 - 1
