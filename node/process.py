"""Settings that hold for the whole process a node runs in, made in one
place: :func:`configure_node_process`, called once at the top of
``wakustore serve`` (cli/serve.py) and of the benchmarks that run a node
in their own process (``bench store``, ``bench wire``). Nothing else in
the node changes a process-wide setting; worker processes (the archive
workers) make their own at their start.
"""

from __future__ import annotations

import logging
import sys

from wakustore import allocator
from wakustore.node.config import NodeConfig

log = logging.getLogger(__name__)

# How long a thread holding the GIL keeps it while another waits (Python's
# default is 5 ms). The event loop serves every connection in one thread
# and needs the GIL for each frame; the reader threads' Python steps would
# otherwise hold it for up to 5 ms at a time while queries wait. `bench
# wire` (100k messages, 16 clients, interleaved runs on a shared 2-core
# machine): 374-393 queries/s and 2.8 ms of node CPU a query at 1 ms,
# 318-322 queries/s and 3.2-3.3 ms at 5 ms, 276-308 queries/s at 20 ms.
GIL_SWITCH_INTERVAL_S = 0.001

# glibc malloc arenas of a node. Its threads (puts, commits, key index
# builds, compactions, pages) share two: each batch and each compacted
# file's index is freed in whichever arena it came from, and memory freed
# in one arena serves only its own threads. bench store at 10M on a shared
# table: peak 1,601 -> 1,333 MB; at 1M owning its table, back to back:
# node peak during the ingest 999 -> 890 MB, ingest 43.3k -> 47.8k msg/s
# (no cost; an earlier single pair had shown 26.9k -> 23.9k).
MALLOC_ARENAS = 2
# libp2p's identify, which a node runs on every connection.
IDENTIFY_PROTOCOL = "/ipfs/id/1.0.0"


class RoutinePeerStreamFilter(logging.Filter):
    """py-libp2p logs a stream it could not open to a peer as a multi-line
    ERROR. Two are routine for a store node, kept at DEBUG: pubsub opens a
    relay stream to every peer that connects, and store and lightpush
    clients speak no relay; the node's identify of a client that asked its
    one question and hung up within milliseconds (the wakustore CLI does)
    finds the connection gone."""

    def __init__(self, relay_protocol: str, identify_protocol: str = IDENTIFY_PROTOCOL) -> None:
        super().__init__()
        self.relay_protocol = relay_protocol
        self.identify_protocol = identify_protocol

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if self.relay_protocol in text and "protocol not supported" in text:
            log.debug("peer does not speak relay: %s", text.splitlines()[0])
            return False
        if text.startswith("Failed to open stream") and f"'{self.identify_protocol}'" in text:
            log.debug("identify of a peer failed (it hung up?): %s", text.splitlines()[0])
            return False
        return True


def configure_node_process(config: NodeConfig) -> list[str]:
    """Make the node's process-wide settings; returns what was set, a
    phrase each (the caller logs them). Made once: a second call changes
    nothing more."""
    from wakustore.node.relay import PROTOCOL_ID as RELAY_PROTOCOL_ID

    done = [f"GIL switch interval {GIL_SWITCH_INTERVAL_S * 1000:g} ms"]
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    if allocator.cap_malloc_arenas(MALLOC_ARENAS):
        done.append(f"{MALLOC_ARENAS} malloc arenas")
    libp2p_host_log = logging.getLogger("libp2p.host.basic_host")
    if not any(isinstance(f, RoutinePeerStreamFilter) for f in libp2p_host_log.filters):
        libp2p_host_log.addFilter(RoutinePeerStreamFilter(RELAY_PROTOCOL_ID))
        done.append("py-libp2p's refused relay and failed identify streams logged at DEBUG")
    return done
