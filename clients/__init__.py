"""Clients of a Waku node: Store v3/v2 and lightpush over libp2p, the
Waku v1 mailserver over devp2p, a bare relay publisher and the archive
helpers a member or an operator runs; with the shared 429 backoff and the
one-line failure descriptions."""
