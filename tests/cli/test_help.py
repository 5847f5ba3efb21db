"""Operator-facing help: ``--version`` and every command's ``--help``."""

import argparse
import importlib.metadata
import itertools
import pathlib
import re
import subprocess
import sys

from wakustore.cli.main import _HelpFormatter, build_parser


def run(*args):
    return subprocess.run([sys.executable, "-m", "wakustore", *args], capture_output=True, text=True, timeout=60)


def _commands(parser, path=()):
    """(path, parser, one-line help) of every command and verb, depth first;
    ``bench``'s verbs from the parser it builds when it runs."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                if path == () and name == "bench":
                    from wakustore.cli.bench import bench_parser

                    sub = bench_parser(type(parser))
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
    for shown in (
        "(default: ./data)",
        "(default: sail)",
        "(default: 60000)",
        "(default: 8000)",
        "(default: 8008)",
        "(default: 30303)",
        "(default: 16)",
        "(default: 32)",
        "(default: 0.0.0.0)",
        "(default: store:60/2s, lightpush:5/1s)",
    ):
        assert shown in text, shown


def test_vacuum_help_shows_an_argparse_default():
    result = run("db", "vacuum", "--help")
    assert result.returncode == 0, result.stderr
    assert "(default: 168)" in " ".join(result.stdout.split())


README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def _readme_synopsis():
    """{command path: flags} from the README's "Command line" block; a
    line may continue with a backslash, ``a|b`` in the command names
    stands for both, and ``  #`` starts a comment."""
    text = README.read_text().split("## Command line", 1)[1]
    block = text.split("```sh\n", 1)[1].split("```", 1)[0]
    flags: dict[tuple[str, ...], set[str]] = {}
    for line in block.replace("\\\n", " ").splitlines():
        words = line.split("  #", 1)[0].split()
        assert words and words[0] == "wakustore", line
        names = []
        for word in words[1:]:
            if word.startswith(("-", "[")) or word == "..." or word.isupper():
                break
            names.append(word.split("|"))
        for path in itertools.product(*names):
            flags.setdefault(path, set()).update(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", line))
    return flags


def test_readme_synopsis_matches_the_real_flags():
    parser = build_parser()
    commands = {path: sub for path, sub, _ in _commands(parser)}
    leaves = {
        path: sub
        for path, sub in commands.items()
        if not any(isinstance(a, argparse._SubParsersAction) for a in sub._actions)
    }
    synopsis = _readme_synopsis()
    for path, flags in synopsis.items():
        command = parser if path == () else leaves.get(path)
        assert command is not None, f"README names no such command: {' '.join(path)}"
        real = {option for action in command._actions for option in action.option_strings}
        assert flags <= real, (path, flags - real)
    for path, command in leaves.items():
        real = {option for action in command._actions for option in action.option_strings}
        assert path in synopsis, f"README lacks {' '.join(path)}"
        assert real - {"-h", "--help"} <= synopsis[path], (path, real - synopsis[path] - {"-h", "--help"})
