"""Operator-facing help: ``--version`` and every command's ``--help``."""

import argparse
import importlib.metadata
import subprocess
import sys

from wakustore.cli.main import _HelpFormatter, build_parser


def run(*args):
    return subprocess.run(
        [sys.executable, "-m", "wakustore", *args], capture_output=True, text=True, timeout=60
    )


def _commands(parser, path=()):
    """(path, parser, one-line help) of every command and verb, depth first."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield (*path, name), sub, helps.get(name)
                yield from _commands(sub, (*path, name))


def test_version_prints_the_installed_version():
    result = run("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"wakustore {importlib.metadata.version('wakustore')}\n"


def test_every_command_has_a_one_line_help_and_a_description():
    commands = list(_commands(build_parser()))
    assert len(commands) > 25  # message, topic, serve, db, query, ... and their verbs
    for path, parser, summary in commands:
        assert summary and "\n" not in summary, path
        assert parser.description, path


def test_every_flag_with_a_default_shows_it():
    for path, parser, _ in _commands(build_parser()):
        formatter = _HelpFormatter(parser.prog)
        for action in parser._actions:
            if not action.option_strings or action.default in (None, False, [], (), argparse.SUPPRESS):
                continue
            assert "default" in formatter._get_help_string(action), (path, action.dest)


def test_serve_help_shows_the_node_defaults():
    result = run("serve", "--help")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    for shown in ("(default: ./data)", "(default: embedded)", "(default: 60000)", "(default: 8000)",
                  "(default: 8008)", "(default: 30303)", "(default: 16)", "(default: 32)",
                  "(default: 0.0.0.0)", "(default: store:60/2s, lightpush:5/1s)"):
        assert shown in text, shown


def test_vacuum_help_shows_an_argparse_default():
    result = run("db", "vacuum", "--help")
    assert result.returncode == 0, result.stderr
    assert "(default: 168)" in " ".join(result.stdout.split())
