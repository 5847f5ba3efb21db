"""The archive client: ask a store node for a community's magnet links,
and check an archive set (data, index, torrent) on disk.

Fetching and hydrating archives is :func:`wakustore.node.archive.fetch_archives`,
which member mode runs inside the node as well.
"""

from __future__ import annotations

import json
from pathlib import Path

from wakustore.clients.store import StoreClient
from wakustore.protocols import archive, topics
from wakustore.protocols.archive import Layout
from wakustore.protocols.errors import ArchiveError, ProtocolError
from wakustore.protocols.store_query import MAX_PAGE_SIZE, HistoryQuery
from wakustore.transport import torrent


async def magnets_from_peer(
    peer: str, community_public_key: bytes, pubsub_topic: str, timeout_s: float = 20.0
) -> list[bytes]:
    """The payloads on the community's magnet topic, asked of a store node
    by Store v3 (``peer``: a multiaddr with ``/p2p/<peer id>``), as
    :func:`wakustore.node.archive.magnets_in_store` reads them locally."""
    query = HistoryQuery(
        pubsub_topic=pubsub_topic,
        content_topics=(topics.magnet_content_topic(community_public_key),),
        forward=True,
        limit=MAX_PAGE_SIZE,
    )
    payloads = []
    async with StoreClient.connect(peer, timeout_s) as client:
        async for response in client.pages(query):
            if response.status_code != 200:
                raise ArchiveError(f"store query refused: {response.status_code} {response.status_desc}")
            payloads += [e.message.payload for e in response.messages if e.message is not None]
    return payloads


def verify_archive_set(community_dir: Path, layout: Layout | None = None) -> tuple[list[str], str]:
    """Problems with a community's data, index and torrent (offsets, sizes,
    padding, index keys, archive contents, piece hashes), and a summary."""
    cid = community_dir.name
    state_path = community_dir.parent / f"{cid}.json"
    state = json.loads(state_path.read_text()) if state_path.exists() else {}
    layout = layout or Layout(state.get("layout", archive.DEFAULT_LAYOUT.value))
    try:
        keys = archive.community_channel_keys(bytes.fromhex(cid[2:]), state.get("chat_ids", []))
    except (ValueError, ProtocolError):
        keys = {}
    data_path, index_path = community_dir / "data", community_dir / "index"
    torrent_path = community_dir.parent / f"{cid}.torrent"
    missing = [str(p) for p in (data_path, index_path, torrent_path) if not p.is_file()]
    if missing:
        return [f"missing: {', '.join(missing)}"], ""
    problems = []
    try:
        entries = archive.parse_index(layout, index_path.read_bytes(), data_path.stat().st_size)
    except ArchiveError as exc:
        entries, problems = [], [f"index: {exc}"]
    messages = 0
    with open(data_path, "rb") as data:
        for entry in entries:
            data.seek(entry.offset)
            try:
                messages += len(archive.read_archive(layout, entry, data.read(entry.size), "", None, keys).messages)
            except ArchiveError as exc:
                problems.append(str(exc))
    problems += torrent.check_torrent(community_dir.parent, torrent_path.read_bytes(), cid, archive.PIECE_LENGTH)
    summary = (
        f"{cid}: {len(entries)} archive(s), {messages} messages, "
        f"{data_path.stat().st_size // archive.PIECE_LENGTH} data pieces, {layout.value} layout"
    )
    return problems, summary
