"""The command line builds its parser without the engine, Arrow, Spark or
libp2p: the defaults it shows are literals kept equal to their sources
here, and --version / --help import none of those packages; `push` and
`query` import libp2p and trio, none of the others."""

from __future__ import annotations

import json
import socket
import subprocess
import sys


def test_parser_literals_equal_their_sources():
    from wakustore.cli import archive as cli_archive
    from wakustore.cli import db as cli_db
    from wakustore.cli import mailserver as cli_mailserver
    from wakustore.cli import query as cli_query
    from wakustore.clients import mailserver as client_mailserver
    from wakustore.clients import store as client_store
    from wakustore.node import config
    from wakustore.node import mailserver as node_mailserver
    from wakustore.protocols import archive
    from wakustore.protocols import mailserver as wms
    from wakustore.protocols.archive_records import Layout
    from wakustore.storage import maintenance
    from wakustore.transport import torrent

    assert config.DEFAULT_RETENTION == maintenance.DEFAULT_RETENTION
    assert cli_db.DEFAULT_VACUUM_HOURS == maintenance.DEFAULT_VACUUM_HOURS
    assert cli_query.DEFAULT_TIMEOUT_S == client_store.DEFAULT_TIMEOUT_S
    assert cli_mailserver.DEFAULT_TIMEOUT_S == client_mailserver.DEFAULT_TIMEOUT_S
    assert cli_mailserver.POST_TTL_S == client_mailserver.POST_TTL_S
    assert cli_mailserver.DEFAULT_PASSWORD == node_mailserver.DEFAULT_PASSWORD
    assert cli_mailserver.LAYOUTS == (wms.LAYOUT_STATUS_GO, wms.LAYOUT_SPEC, wms.LAYOUT_DIRECT)
    assert cli_archive.LAYOUTS == tuple(layout.value for layout in Layout)
    assert cli_archive.DEFAULT_LAYOUT == archive.DEFAULT_LAYOUT.value
    assert cli_archive.DEFAULT_STALL_TIMEOUT_S == torrent.DEFAULT_STALL_TIMEOUT_S


HEAVY = ("pyarrow", "pyspark", "deltalake", "pandas", "libp2p", "libtorrent", "trio", "numpy")


def test_version_and_help_load_no_engine_arrow_or_libp2p():
    probe = (
        "import sys, json, contextlib, io\n"
        "from wakustore.cli.main import main\n"
        "for argv in (['--version'], ['--help'], ['serve', '--help'], ['query', '--help'], ['db', 'stats', '--help']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        try:\n"
        "            main(argv)\n"
        "        except SystemExit:\n"
        "            pass\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


# What `push` and `query` must not load: the engine, Arrow, Spark,
# BitTorrent, the storage layer, and the node beyond the configuration
# whose defaults the parser shows (node.config).
NOT_FOR_CLIENTS = ("pyarrow", "pyspark", "pysail", "deltalake", "pandas", "numpy", "libtorrent", "hypercorn")
CLIENT_MODULES = (
    "wakustore.clients",
    "wakustore.transport",
    "wakustore.cli",
    "wakustore.protocols",
    "wakustore.protos",
)


def test_push_and_query_load_no_engine_arrow_torrent_or_node():
    with socket.socket() as closed:  # a port from the kernel, bound, not listening: refused
        closed.bind(("127.0.0.1", 0))
        peer = f"/ip4/127.0.0.1/tcp/{closed.getsockname()[1]}/p2p/16Uiu2HAmPLe7Mzm8TsYUubgCAW1aJoeFScxrLj8ppHFivPo97bUZ"
        probe = (
            "import sys, json, contextlib, io\n"
            "from wakustore.cli.main import main\n"
            f"peer = {peer!r}\n"
            "codes = []\n"
            "for argv in (\n"
            "    ['push', '--peer', peer, '--pubsub-topic', '/waku/2/rs/16/32', '--content-topic', '/a/1/b/proto',\n"
            "     '--payload', '01', '--timeout', '10'],\n"
            "    ['query', '--peer', peer, '--pubsub-topic', '/waku/2/rs/16/32', '--content-topic', '/a/1/b/proto',\n"
            "     '--timeout', '10'],\n"
            "):\n"
            "    with contextlib.redirect_stderr(io.StringIO()):\n"
            "        codes.append(main(argv))\n"
            "print(json.dumps({'codes': codes, 'modules': sorted(sys.modules)}))\n"
        )
        result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["codes"] == [1, 1]  # both dialed (and were refused): the whole client path ran
    loaded = set(answer["modules"])
    assert {"libp2p", "trio", "wakustore.clients.store", "wakustore.transport.host"} <= loaded
    assert sorted(m for m in NOT_FOR_CLIENTS if m in loaded) == []
    ours = {m for m in loaded if m.startswith("wakustore.")}
    extra = {m for m in ours if not m.startswith(CLIENT_MODULES)} - {
        "wakustore.usage",
        "wakustore.node",
        "wakustore.node.config",
    }
    assert sorted(extra) == []


def test_every_flag_of_every_command_says_what_it_is():
    import argparse

    from wakustore.cli.main import build_parser

    def silent(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from silent(sub, [*path, name])
            elif action.option_strings and not isinstance(action, argparse._HelpAction) and not action.help:
                yield " ".join([*path, "/".join(action.option_strings)])

    assert list(silent(build_parser(), ["wakustore"])) == []
