// js-waku (@waku/sdk 0.0.36) light client used by the interop tests.
//
// Usage:
//   node store_client.mjs '<json>'        (or the JSON on standard input)
//
// JSON fields:
//   peer            multiaddr of the service node, /ip4/127.0.0.1/tcp/N/p2p/<peer id>
//   clusterId       cluster id (metadata handshake and pubsub topic)
//   shard           static shard for the decoders/encoders
//   contentTopics   content topics to query (one decoder each)
//   push            optional list of {contentTopic, payloadHex, timestampMs}
//                   sent by lightpush before the query
//   useLegacyLightpush  true: /vac/waku/lightpush/2.0.0-beta1, else 3.0.0
//   query           optional {pageSize, forward, timeStartMs, timeEndMs,
//                   messageHashes: [hex], maxPages}; omitted or null: no query
//   transport       "tcp" (default) or "ws" (plain websockets, /ip4/.../tcp/N/ws/p2p/...)
//   muxer           "yamux", "mplex" or both (default: yamux preferred, then mplex)
//   idleMs          optional: once js-waku has opened its streams for the
//                   protocols in use (it does so on connect), stay idle this
//                   long before the first push or query, as an application
//                   that connects and sends later does
//   timeoutMs       overall deadline (default 30000)
//
// Output: JSON lines on standard output:
//   {"event":"connected", ...}
//   {"event":"idle", "ms", "before": [{id, protocol}], "after": [{id, protocol,
//    readStatus, writeStatus}]}  (with idleMs: the streams open on the
//    connection before and after the idle time)
//   {"event":"pushed", "contentTopic", "successes", "failures"}
//   {"event":"message", "hash", "payload", "timestamp", "contentTopic",
//    "pubsubTopic", "meta", "version"}
//   {"event":"done", "count"}
//   {"event":"error", "error"}
// Exit code 0 on success, 1 on any error.

// Must stay the first import: Node 20 lacks Promise.withResolvers (see polyfill.mjs).
import "./polyfill.mjs";
import { tcp } from "@libp2p/tcp";
import { yamux } from "@chainsafe/libp2p-yamux";
import { mplex } from "@libp2p/mplex";
import { webSockets } from "@libp2p/websockets";
import { all as allMultiaddrs } from "@libp2p/websockets/filters";
import { multiaddr } from "@multiformats/multiaddr";
import { createLightNode, Protocols, waku } from "@waku/sdk";

function emit(obj) {
  process.stdout.write(JSON.stringify(obj) + "\n");
}

function hexToBytes(hex) {
  const clean = hex.startsWith("0x") ? hex.slice(2) : hex;
  return Uint8Array.from(Buffer.from(clean, "hex"));
}

function bytesToHex(bytes) {
  return bytes ? Buffer.from(bytes).toString("hex") : null;
}

async function readConfig() {
  if (process.argv[2]) {
    return JSON.parse(process.argv[2]);
  }
  const chunks = [];
  for await (const chunk of process.stdin) {
    chunks.push(chunk);
  }
  return JSON.parse(Buffer.concat(chunks).toString("utf8"));
}

export async function lightpush(node, { contentTopic, shard, payloadHex, timestampMs, useLegacy }) {
  const encoder = node.createEncoder({ contentTopic, shardId: shard });
  const message = { payload: hexToBytes(payloadHex) };
  if (timestampMs !== undefined && timestampMs !== null) {
    message.timestamp = new Date(timestampMs);
  }
  const result = await node.lightPush.send(encoder, message, {
    autoRetry: false,
    useLegacy: Boolean(useLegacy),
  });
  return {
    successes: result.successes.map((p) => p.toString()),
    failures: result.failures.map((f) => ({ error: f.error, peer: f.peerId?.toString() })),
  };
}

export async function query(node, { contentTopics, shard, peerId, pageSize, forward, timeStartMs, timeEndMs, messageHashes, maxPages }) {
  const decoders = contentTopics.map((contentTopic) => node.createDecoder({ contentTopic, shardId: shard }));
  const options = { peerId };
  if (pageSize) options.paginationLimit = pageSize;
  if (forward !== undefined && forward !== null) options.paginationForward = Boolean(forward);
  if (timeStartMs !== undefined && timeStartMs !== null) options.timeStart = new Date(timeStartMs);
  if (timeEndMs !== undefined && timeEndMs !== null) options.timeEnd = new Date(timeEndMs);
  if (messageHashes && messageHashes.length) options.messageHashes = messageHashes.map(hexToBytes);
  let count = 0;
  let pages = 0;
  for await (const page of node.store.queryGenerator(decoders, options)) {
    pages += 1;
    for (const msg of await Promise.all(page)) {
      if (!msg) continue;
      count += 1;
      emit({
        event: "message",
        hash: msg.hashStr,
        payload: bytesToHex(msg.payload),
        timestamp: msg.proto.timestamp !== undefined && msg.proto.timestamp !== null ? msg.proto.timestamp.toString() : null,
        contentTopic: msg.contentTopic,
        pubsubTopic: msg.pubsubTopic,
        meta: bytesToHex(msg.meta),
        version: msg.version,
      });
    }
    if (maxPages && pages >= maxPages) break;
  }
  return { count, pages };
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// js-libp2p announces no event when js-waku opens a stream, so look at the
// connection's streams until every protocol has one.
const STREAM_POLL_MS = 50;

function openStreams(node) {
  return node.libp2p.getConnections().flatMap((conn) => conn.streams);
}

async function waitForStreams(node, protocols, deadlineMs) {
  const until = Date.now() + deadlineMs;
  for (;;) {
    const open = openStreams(node);
    if (protocols.every((protocol) => open.some((s) => s.protocol === protocol))) return open;
    if (Date.now() > until) {
      throw new Error(`js-waku opened no stream for ${protocols}: open ${open.map((s) => s.protocol)}`);
    }
    await sleep(STREAM_POLL_MS);
  }
}

// waitForPeers can resolve before identify has told the peer store what
// the peer speaks (its metadata check passes on a peer with no protocols
// yet), and lightpush/store pick peers from that store: "No peer
// available". An application retries; this waits for the codecs instead.
async function waitForIdentify(node, peerIdStr, codecs, deadlineMs) {
  const until = Date.now() + deadlineMs;
  for (;;) {
    const peerId = node.libp2p.getPeers().find((id) => id.toString() === peerIdStr);
    const known = peerId ? (await node.libp2p.peerStore.get(peerId)).protocols : [];
    if (codecs.every((codec) => known.includes(codec))) return;
    if (Date.now() > until) {
      throw new Error(`the peer announced ${known}, not all of ${codecs}`);
    }
    await sleep(STREAM_POLL_MS);
  }
}

async function stayIdle(node, cfg, timeoutMs) {
  const protocols = [];
  if (cfg.push && cfg.push.length) {
    protocols.push(cfg.useLegacyLightpush ? waku.LightPushCodecV2 : waku.LightPushCodec);
  }
  if (cfg.query) protocols.push(waku.StoreCodec);
  const before = await waitForStreams(node, protocols, timeoutMs);
  await sleep(cfg.idleMs);
  emit({
    event: "idle",
    ms: cfg.idleMs,
    before: before.map((s) => ({ id: s.id, protocol: s.protocol })),
    after: openStreams(node).map((s) => ({
      id: s.id, protocol: s.protocol, readStatus: s.readStatus, writeStatus: s.writeStatus,
    })),
  });
}

async function main() {
  const cfg = await readConfig();
  const timeoutMs = cfg.timeoutMs ?? 30000;
  const timer = setTimeout(() => {
    emit({ event: "error", error: `timeout after ${timeoutMs} ms` });
    process.exit(1);
  }, timeoutMs);

  const peer = multiaddr(cfg.peer);
  const node = await createLightNode({
    libp2p: {
      transports: cfg.transport === "ws" ? [webSockets({ filter: allMultiaddrs })] : [tcp()],
      streamMuxers: cfg.muxer === "mplex" ? [mplex()] : cfg.muxer === "yamux" ? [yamux()] : [yamux(), mplex()],
      hideWebSocketInfo: true,
    },
    networkConfig: { clusterId: cfg.clusterId },
    store: { peers: [cfg.peer] },
    lightPush: { numPeersToUse: 1 },
  });
  try {
    await node.dial(peer);
    const protocols = [];
    if (cfg.push && cfg.push.length) protocols.push(Protocols.LightPush);
    if (cfg.query) protocols.push(Protocols.Store);
    await node.waitForPeers(protocols, timeoutMs);
    const codecs = [];
    if (cfg.push && cfg.push.length) codecs.push(cfg.useLegacyLightpush ? waku.LightPushCodecV2 : waku.LightPushCodec);
    if (cfg.query) codecs.push(waku.StoreCodec);
    await waitForIdentify(node, peer.getPeerId(), codecs, timeoutMs);
    const conn = node.libp2p.getConnections()[0];
    emit({
      event: "connected",
      peer: peer.getPeerId(),
      muxer: conn?.multiplexer ?? null,
      encryption: conn?.encryption ?? null,
    });
    if (cfg.idleMs) await stayIdle(node, cfg, timeoutMs);
    for (const item of cfg.push ?? []) {
      const res = await lightpush(node, { ...item, shard: item.shard ?? cfg.shard, useLegacy: cfg.useLegacyLightpush });
      emit({ event: "pushed", contentTopic: item.contentTopic, ...res });
      if (res.successes.length === 0) throw new Error(`lightpush failed: ${JSON.stringify(res.failures)}`);
    }
    if (cfg.query) {
      const { count, pages } = await query(node, {
        ...cfg.query,
        contentTopics: cfg.contentTopics,
        shard: cfg.shard,
        peerId: undefined,
      });
      emit({ event: "done", count, pages });
    } else {
      emit({ event: "done", count: 0, pages: 0 });
    }
  } finally {
    clearTimeout(timer);
    await node.stop();
  }
}

main().then(
  () => process.exit(0),
  (err) => {
    emit({ event: "error", error: String(err?.stack ?? err) });
    process.exit(1);
  },
);
