"""The CLI reproduces the published vectors and reports bad input on one line."""

import subprocess
import sys

import pytest


def run(*args):
    return subprocess.run([sys.executable, "-m", "wakustore", *args], capture_output=True, text=True, timeout=60)


HASH_ARGS = (
    "message",
    "hash",
    "--pubsub-topic",
    "/waku/2/default-waku/proto",
    "--content-topic",
    "/waku/2/default-content/proto",
    "--payload",
    "010203045445535405060708",
    "--timestamp",
    str(0x175789BFA23F8400),
)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (("--meta", "73757065722d736563726574"), "64cce733fed134e83da02b02c6f689814872b1a0ac97ea56b76095c3c72bfe05"),
        ((), "a2554498b31f5bcdfcbf7fa58ad1c2d45f0254f3f8110a85588ec3cf10720fd8"),
        (("--meta", bytes(range(64)).hex()), "7158b6498753313368b9af8f6e0a0a05104f68f972981da42a43bc53fb0c1b27"),
    ],
)
def test_message_hash_prints_published_vectors(extra, expected):
    result = run(*HASH_ARGS, *extra)
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected + "\n"


def test_message_hash_with_empty_payload_vector():
    args = list(HASH_ARGS)
    args[args.index("--payload") + 1] = ""
    result = run(*args, "--meta", "73757065722d736563726574")
    assert result.stdout.strip() == "483ea950cb63f9b9d6926b262bb36194d3f40a0463ce8446228350bd44e96de4"


def test_message_muid_prints_checksum_and_meta():
    import hashlib

    result = run(
        "message", "muid", "--pubsub-topic", "/n", "--content-topic", "/c", "--payload", "0x0102", "--meta", "aa"
    )
    expected = hashlib.sha256(b"/n/c\xaa\x01\x02").hexdigest() + "aa"
    assert result.stdout.strip() == expected


KEY = "049c5fac802da41e07e6cdf51c3b9a6351ad5e65921527f2df5b7d59fd9b56ab02bab736cdcfc37f25095e78127500da371947217a8cd5186ab890ea866211c3f6"


def test_topic_commands():
    assert run("topic", "shard", "--cluster", "16", "--index", "18").stdout == "/waku/2/rs/16/18\n"
    assert run("topic", "magnet", "--pubkey", KEY).stdout == "/waku/1/0x96bf580a/rfc26\n"
    community = run("topic", "community", "--pubkey", KEY).stdout.strip()
    channel = run("topic", "channel", "--pubkey", KEY, "--chat-id", "abc").stdout.strip()
    assert community.startswith("/waku/1/0x") and community.endswith("/rfc26")
    assert channel.startswith("/waku/1/0x") and channel != community


@pytest.mark.parametrize(
    "args",
    [
        ("message", "hash", "--pubsub-topic", "/p", "--content-topic", "/c", "--payload", "abc"),
        ("message", "hash", "--pubsub-topic", "/p", "--content-topic", "/c", "--payload", "zz"),
        ("message", "muid", "--pubsub-topic", "/p", "--content-topic", "/c", "--payload", "00", "--meta", "0"),
        ("topic", "community", "--pubkey", "0211"),
        ("topic", "magnet", "--pubkey", "04" + "00" * 64),
        ("topic", "shard", "--cluster", "16", "--index", "1024"),
        ("topic", "shard", "--cluster", "x", "--index", "1"),
        ("topic", "shard", "--cluster", "1", "--index", "1", "--frobnicate"),
        ("message", "hash", "--pubsub-topic", "/p", "--content-topic", "/c", "--payload", "00", "--timestamp", "-1"),
    ],
)
def test_bad_input_prints_one_line_and_exits_2(args):
    result = run(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("wakustore: error: ")
