// js-waku's peer-exchange discovery (@waku/discovery wakuPeerExchangeDiscovery,
// as @waku/sdk wires it) against one bootstrap node.
//
//   node px_discover.mjs '<json>'   {peer, clusterId, timeoutMs}
//
// Prints {"event":"discovered","peerId","multiaddrs"} for each peer the
// node's answers name, then {"event":"done"} once peer exchange has been
// answered at least once and the deadline (or the first discovery) is
// reached.
import "./polyfill.mjs";
import { tcp } from "@libp2p/tcp";
import { yamux } from "@chainsafe/libp2p-yamux";
import { createLightNode } from "@waku/sdk";
import { multiaddr } from "@multiformats/multiaddr";

const cfg = JSON.parse(process.argv[2]);
const emit = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");
const timer = setTimeout(() => {
  emit({ event: "error", error: `timeout after ${cfg.timeoutMs} ms` });
  process.exit(1);
}, cfg.timeoutMs ?? 30000);

const node = await createLightNode({
  libp2p: { transports: [tcp()], streamMuxers: [yamux()] },
  networkConfig: { clusterId: cfg.clusterId },
  discovery: { dns: false, peerExchange: true, peerCache: false },
  bootstrapPeers: [cfg.peer],
});
const bootstrap = multiaddr(cfg.peer).getPeerId();
node.libp2p.addEventListener("peer:discovery", (event) => {
  const id = event.detail.id.toString();
  if (id === bootstrap) return;
  emit({ event: "discovered", peerId: id, multiaddrs: event.detail.multiaddrs.map((m) => m.toString()) });
  clearTimeout(timer);
  node.stop().then(() => {
    emit({ event: "done" });
    process.exit(0);
  });
});
await node.start();
await node.dial(multiaddr(cfg.peer));
