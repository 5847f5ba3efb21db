"""Console entry point; the commands themselves live in ``wakustore.node.cli``."""

from wakustore.node.cli import main

__all__ = ["main"]
