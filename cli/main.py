"""The ``wakustore`` command line: the parser, ``message`` and ``topic``,
and :func:`main` (the console entry point).

Usage errors (bad hex, wrong key length, unknown flag) print one line on
stderr and exit with status 2; nothing else is printed.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
from collections.abc import Callable, Sequence

from wakustore.cli.parser import _HelpFormatter, _Parser, document  # noqa: F401 (also the tests')
from wakustore.protocols.errors import ProtocolError
from wakustore.protocols.message import WakuMessage, message_hash, muid
from wakustore.usage import UsageError, parse_hex

EXIT_USAGE = 2


def _nonnegative_int(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {text}")
    return value


def _message_from_args(args: argparse.Namespace) -> WakuMessage:
    return WakuMessage(
        payload=parse_hex(args.payload, "--payload"),
        content_topic=args.content_topic,
        meta=parse_hex(args.meta, "--meta") if args.meta else b"",
        timestamp=getattr(args, "timestamp", 0) or 0,
    )


def _cmd_message_hash(args: argparse.Namespace) -> int:
    print(message_hash(args.pubsub_topic, _message_from_args(args)).hex())
    return 0


def _cmd_message_muid(args: argparse.Namespace) -> int:
    print(muid(args.pubsub_topic, _message_from_args(args)).hex())
    return 0


# protocols.topics (and its keccak and secp256k1) is imported by the topic
# commands alone: `push` and `query` build the same parser.


def _cmd_topic_community(args: argparse.Namespace) -> int:
    from wakustore.protocols import topics

    print(topics.community_content_topic(parse_hex(args.pubkey, "--pubkey")))
    return 0


def _cmd_topic_channel(args: argparse.Namespace) -> int:
    from wakustore.protocols import topics

    print(topics.channel_content_topic(parse_hex(args.pubkey, "--pubkey"), args.chat_id))
    return 0


def _cmd_topic_magnet(args: argparse.Namespace) -> int:
    from wakustore.protocols import topics

    print(topics.magnet_content_topic(parse_hex(args.pubkey, "--pubkey")))
    return 0


def _cmd_topic_shard(args: argparse.Namespace) -> int:
    from wakustore.protocols import topics

    print(topics.shard_pubsub_topic(args.cluster, args.index))
    return 0


def _cmd_enr_decode(args: argparse.Namespace) -> int:
    from wakustore.protocols import enr

    record = enr.decode(args.record)
    print(json.dumps(record.describe(), indent=2))
    return 0


def version() -> str:
    """The installed distribution's version (pyproject's ``version``)."""
    try:
        return importlib.metadata.version("wakustore")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="wakustore", description="A history node for Waku networks.")
    parser.add_argument("--version", action="version", version=f"wakustore {version()}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    message = commands.add_parser("message", help="message hash and MUID")
    message_verbs = message.add_subparsers(dest="verb", required=True, parser_class=_Parser)
    for verb, handler, with_timestamp in (
        ("hash", _cmd_message_hash, True),
        ("muid", _cmd_message_muid, False),
    ):
        sub = message_verbs.add_parser(
            verb,
            help={
                "hash": "the deterministic message hash (14/WAKU2-MESSAGE), hex",
                "muid": "the Waku Message UID (waku-message-uid-adr), the table's key, hex",
            }[verb],
        )
        sub.add_argument("--pubsub-topic", required=True, help="e.g. /waku/2/rs/16/32")
        sub.add_argument("--content-topic", required=True, help="e.g. /app/1/chat/proto")
        sub.add_argument("--payload", required=True, help="hex")
        sub.add_argument("--meta", help="hex")
        if with_timestamp:
            sub.add_argument("--timestamp", type=_nonnegative_int, default=0, help="Unix ns")
        sub.set_defaults(handler=handler)

    topic = commands.add_parser("topic", help="community, channel, magnet and shard topics")
    topic_verbs = topic.add_subparsers(dest="verb", required=True, parser_class=_Parser)
    for verb, handler in (
        ("community", _cmd_topic_community),
        ("channel", _cmd_topic_channel),
        ("magnet", _cmd_topic_magnet),
    ):
        sub = topic_verbs.add_parser(verb, help=f"a community's {verb} content topic")
        sub.add_argument("--pubkey", required=True, help="33- or 65-byte public key, hex")
        if verb == "channel":
            sub.add_argument("--chat-id", required=True, help="the channel's id inside the community")
        sub.set_defaults(handler=handler)
    shard = topic_verbs.add_parser("shard", help="the pubsub topic of a static shard")
    shard.add_argument("--cluster", type=_nonnegative_int, required=True, help="cluster id, 0-65535 (Status: 16)")
    shard.add_argument("--index", type=_nonnegative_int, required=True, help="shard index in the cluster, 0-1023")
    shard.set_defaults(handler=_cmd_topic_shard)

    record = commands.add_parser("enr", help="Ethereum Node Records (EIP-778) with Waku's fields")
    record_verbs = record.add_subparsers(dest="verb", required=True, parser_class=_Parser)
    decode = record_verbs.add_parser(
        "decode", help="check a record's signature and print its fields as JSON (ours, nwaku's, js-waku's)"
    )
    decode.add_argument("record", help="enr:... text")
    decode.set_defaults(handler=_cmd_enr_decode)

    for register in _extra_commands():
        register(commands)
    document(parser)
    return parser


def _extra_commands() -> list[Callable[[argparse._SubParsersAction], None]]:
    """The other commands, one module each in this package (imported lazily
    so that `wakustore message hash` does not load the engine stack).
    Registration goes one way: this module imports them, never the reverse."""
    from wakustore.cli import archive, bench, db, mailserver, query, serve, soak

    return [
        serve.register,
        db.register,
        query.register,
        mailserver.register,
        archive.register,
        bench.register,
        soak.register,
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        return args.handler(args)
    except (UsageError, ProtocolError) as exc:
        print(f"wakustore: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        # A file that cannot be read or written, an address that cannot be
        # bound or reached: what the operator must fix, on one line.
        where = f": {exc.filename}" if exc.filename else ""
        print(f"wakustore: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as exc:
        from wakustore.node.config import ConfigError
        from wakustore.storage.maintenance import RetentionError

        if not isinstance(exc, (ConfigError, RetentionError)):
            raise
        print(f"wakustore: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:
        from wakustore.storage.engine import EngineUnavailable

        if not isinstance(exc, EngineUnavailable):
            raise
        # The engine did not start or cannot be reached (its jars missing,
        # no Java, a remote address that does not answer): one line.
        print(f"wakustore: error: the engine is unavailable: {exc}", file=sys.stderr)
        return 1
