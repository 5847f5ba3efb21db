"""The command line builds its parser without the engine, Arrow, Spark or
libp2p: the defaults it shows are literals kept equal to their sources
here, and --version / --help import none of those packages."""

from __future__ import annotations

import json
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
