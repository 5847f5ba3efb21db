"""The transports under the node and the clients: libp2p (a host factory,
yamux, Noise and multistream-select as this project tunes them, stream and
frame helpers, peer addresses), devp2p RLPx sessions for the legacy
mailserver, and BitTorrent sessions for the archives.

``node/`` and ``clients/`` build on this package; it imports nothing of
theirs. :mod:`wakustore.transport.libp2p` is the one module that replaces
py-libp2p code (see its notes).
"""
