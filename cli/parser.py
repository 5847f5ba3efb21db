"""The command line's parser class and help conventions, shared by
:mod:`wakustore.cli.main` and the parsers built later (``bench``'s)."""

from __future__ import annotations

import argparse
from typing import NoReturn

from wakustore.usage import UsageError

_NO_DEFAULT: tuple[object, ...] = (None, False, [], (), argparse.SUPPRESS)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a flag's default unless there is none to show (None, False,
    an empty list) or its help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        help_text = action.help or ""
        if "default" in help_text or action.default in _NO_DEFAULT:
            return help_text
        if not action.option_strings and action.nargs not in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            return help_text
        return (help_text + " (default: %(default)s)").lstrip()


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:  # argparse calls this on bad flags
        raise UsageError(message)


def document(parser: argparse.ArgumentParser) -> None:
    """Every command's one-line help (shown in its parent's list) is also
    its own description (shown by its ``--help``), and a flag without help
    still shows its default (argparse prints nothing for it otherwise)."""
    for action in parser._actions:
        if action.help is None and action.default not in _NO_DEFAULT and action.option_strings:
            action.help = "(default: %(default)s)"
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {choice.dest: choice.help for choice in action._choices_actions}
        for name, sub in action.choices.items():
            help_text = helps.get(name)
            if sub.description is None and help_text:
                sub.description = help_text[:1].upper() + help_text[1:] + "."
            document(sub)
