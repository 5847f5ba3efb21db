"""The ``wakustore`` commands: argument parsing and output, over
``wakustore.node`` (the running node) and ``wakustore.clients``. The entry
point is :func:`wakustore.cli.main.main`."""
