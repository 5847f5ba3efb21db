"""wakustore: a history node for Waku networks.

The code lives in the sibling packages mapped under this name
(``wakustore.protos``, ``wakustore.protocols``, ``wakustore.storage``,
``wakustore.node``, ``wakustore.clients``, ``wakustore.cli``,
``wakustore.bench``); see pyproject.toml.
"""

__version__ = "0.1.0"
