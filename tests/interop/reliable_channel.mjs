// Two js-waku (@waku/sdk 0.0.36) participants on one ReliableChannel
// (Scalable Data Sync, @waku/sds 0.0.8); one of them goes offline for a
// while and recovers what it missed from a store node.
//
// Usage:
//   node reliable_channel.mjs '<json>'        (or the JSON on standard input)
//
// JSON fields:
//   storePeer       multiaddr of the store node (and lightpush service node)
//   filterPeer      multiaddr of the filter service node
//   clusterId, shard, contentTopic, channelId
//   before          messages each participant sends while both are online
//   whileOffline    messages "alice" sends while "bob" is offline
//   after           messages each participant sends once bob is back
//   offlineMs       how long bob stays offline (at least until alice's
//                   messages of that time are sent)
//   sendGapMs       pause between two sends of a participant (default 200)
//   channel         ReliableChannel options (retrieveFrequencyMs,
//                   syncMinIntervalMs, retryIntervalMs, maxRetryAttempts, ...)
//   pinTimestamps   true: each outgoing Waku message is stamped once (see
//                   below); false: as @waku/sdk 0.0.36 stamps them
//   settleMs        once everything is delivered, how long to keep running
//                   to see late duplicates (default 3000)
//   timeoutMs       overall deadline (default 120000)
//
// Offline: bob's libp2p connection gater refuses every dial and inbound
// connection, and bob closes his connections; js-waku's own connection
// manager dials its bootstrap peers again once the gater lets it (every
// 5 s, failedDialCooldown shortened to 2 s). Nothing else is done for the
// recovery: js-waku's query-on-connect (a time-range query from its last
// successful query, on reconnecting to the store node) and its missing
// message retriever (hash queries for what causal histories name) do it.
//
// Output: JSON lines on standard output:
//   {"event":"ready", "participants": {name: peerId}}
//   {"event":"phase", "phase": "before"|"offline"|"online"|"after"|"settled", "at"}
//   {"event":"query", "participant", "kind": "hashes"|"time", "peer",
//    "hashes": [hex asked], "timeStart", "timeEnd", "forward", "pages",
//    "requests", "started", "ended", "got": [{hash, sdsId}], "error"}
//   {"event":"done", "participants": {name: {peerId, sent: [{id, text,
//    hint}], inbox: [{id, text, count}], deliveries: {id: n},
//    localHistory: [id], missing: [{id, hint}], irretrievable: [id],
//    arrivals: {id: [{via: "filter"|"store-time"|"store-hashes", hash, at}]},
//    errors: [...]}}, "offlineAt", "onlineAt", "missed": [id]}
//   {"event":"error", "error", "state"}
// Exit code 0 on success, 1 on any error.
//
// pinTimestamps: ReliableChannel 0.0.36 computes a sent message's retrieval
// hint from one encoding of it and sends another (each stamps Date.now()),
// so whenever the two fall in different milliseconds the hint names a
// message nobody sent. With pinTimestamps the encoder stamps a message
// object once, and both encodings agree.

// Must stay the first import: Node 20 lacks Promise.withResolvers (see polyfill.mjs).
import "./polyfill.mjs";
import { yamux } from "@chainsafe/libp2p-yamux";
import { mplex } from "@libp2p/mplex";
import { tcp } from "@libp2p/tcp";
import { multiaddr } from "@multiformats/multiaddr";
import { createLightNode, Protocols, ReliableChannel } from "@waku/sdk";
import { Message as SdsMessage, MessageChannelEvent } from "@waku/sds";

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const POLL_MS = 100;

function emit(obj) {
  process.stdout.write(JSON.stringify(obj, (_, v) => (typeof v === "bigint" ? v.toString() : v)) + "\n");
}

function hex(bytes) {
  return bytes ? Buffer.from(bytes).toString("hex") : null;
}

async function readConfig() {
  if (process.argv[2]) return JSON.parse(process.argv[2]);
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return JSON.parse(Buffer.concat(chunks).toString("utf8"));
}

function sdsIdOf(wakuMessage) {
  const sds = wakuMessage?.payload ? SdsMessage.decode(wakuMessage.payload) : undefined;
  return sds ? sds.messageId : null;
}

// Reads a metadata answer's shards as nwaku does (waku/waku_metadata/rpc.nim):
// field 3 (packed) first, then field 2. @waku/proto 0.0.15 reads field 2
// only; go-waku writes field 3 only, so js-waku would take the filter node
// for a node of no shard and never subscribe through it.
function readShardsLikeNwaku(metadata) {
  const decode = metadata.decodeMetadataResponse.bind(metadata);
  metadata.decodeMetadataResponse = (chunks) => {
    const result = decode(chunks);
    if (result.shardInfo && result.shardInfo.shards.length === 0) {
      const raw = Buffer.concat(chunks.map((c) => (c.subarray ? c.subarray() : c)));
      let packed = [];
      try {
        packed = packedShards(raw);
      } catch {
        // what js-waku decoded stands
      }
      if (packed.length) result.shardInfo = { ...result.shardInfo, shards: packed };
    }
    return result;
  };
}

function packedShards(raw) {
  let pos = 0;
  const varint = () => {
    let value = 0;
    for (let shift = 0; ; shift += 7) {
      if (pos >= raw.length || shift > 49) throw new Error("truncated varint");
      const byte = raw[pos++];
      value += (byte & 0x7f) * 2 ** shift;
      if (byte < 0x80) return value;
    }
  };
  const shards = [];
  while (pos < raw.length) {
    const tag = varint();
    const [field, wire] = [Math.floor(tag / 8), tag & 7];
    if (wire === 0) {
      const value = varint();
      if (field === 3) shards.push(value);
    } else if (wire === 2) {
      const end = varint() + pos;
      if (field === 3) while (pos < end) shards.push(varint());
      pos = end;
    } else if (wire === 1 || wire === 5) {
      pos += wire === 1 ? 8 : 4;
    } else {
      return [];
    }
  }
  return shards;
}

// An encoder that stamps each message object once (see pinTimestamps).
function pinnedEncoder(encoder) {
  const stamps = new WeakMap();
  const stamped = (message) => {
    if (message.timestamp !== undefined) return message;
    if (!stamps.has(message)) stamps.set(message, new Date());
    return { ...message, timestamp: stamps.get(message) };
  };
  return new Proxy(encoder, {
    get(target, prop, receiver) {
      if (prop === "toProtoObj") return (message) => target.toProtoObj(stamped(message));
      if (prop === "toWire") return (message) => target.toWire(stamped(message));
      return Reflect.get(target, prop, receiver);
    },
  });
}

class Participant {
  constructor(name, cfg) {
    this.name = name;
    this.cfg = cfg;
    this.offline = false;
    this.sent = []; // {id, text, hint}: hint, the Waku message hash SDS gives others to find it by
    this.inbox = new Map(); // id -> {id, text, count}: what the application was handed
    this.deliveries = new Map(); // id -> times SDS delivered it
    this.missing = new Map(); // id -> hint
    this.irretrievable = [];
    this.arrivals = new Map(); // SDS id -> [{via, hash, at}]: each Waku message of it that came in
    this.errors = [];
  }

  async start() {
    const cfg = this.cfg;
    const gate = async () => this.offline;
    this.node = await createLightNode({
      autoStart: false,
      libp2p: {
        start: false,
        transports: [tcp()],
        streamMuxers: [yamux(), mplex()],
        hideWebSocketInfo: true,
        connectionGater: {
          denyDialMultiaddr: gate,
          denyDialPeer: gate,
          denyInboundConnection: gate,
          denyOutboundConnection: gate,
        },
      },
      networkConfig: { clusterId: cfg.clusterId },
      bootstrapPeers: [cfg.storePeer, cfg.filterPeer],
      store: { peers: [cfg.storePeer] },
      connectionManager: { failedDialCooldown: 2, dialCooldown: 2 },
    });
    readShardsLikeNwaku(this.node.libp2p.services.metadata);
    this.instrument();
    let encoder = this.node.createEncoder({ contentTopic: cfg.contentTopic, shardId: cfg.shard });
    if (cfg.pinTimestamps) encoder = pinnedEncoder(encoder);
    const decoder = this.node.createDecoder({ contentTopic: cfg.contentTopic, shardId: cfg.shard });
    // The channel starts as soon as the node does, before any peer is
    // connected, as an application would: its query-on-connect sees the
    // store node connect (a first query, from 30 days back) and its filter
    // subscription waits for the filter node.
    await this.node.start();
    this.channel = await ReliableChannel.create(this.node, cfg.channelId, this.name, encoder, decoder, cfg.channel ?? {});
    this.listen();
    await this.node.waitForPeers([Protocols.Filter, Protocols.LightPush, Protocols.Store], cfg.timeoutMs);
  }

  // Subscribed through the filter node and done with the first query.
  ready() {
    const subscribed = [...this.node.filter.subscriptions.values()].some((s) => s.peers.size > 0);
    return subscribed && this.channel.queryOnConnect.lastSuccessfulQuery > 0;
  }

  // Records what every store query asked, of whom, and what came back (at
  // StoreCore.queryPerPage, under both the query-on-connect and the
  // missing-message retriever), and what the filter subscription delivered.
  instrument() {
    const core = this.node.store.protocol;
    const queryPerPage = core.queryPerPage.bind(core);
    const participant = this;
    core.queryPerPage = async function* (options, decoders, peerId) {
      const hashes = (options.messageHashes ?? []).map(hex);
      const record = {
        event: "query",
        participant: participant.name,
        kind: hashes.length ? "hashes" : "time",
        peer: peerId?.toString() ?? null,
        hashes,
        timeStart: options.timeStart?.getTime() ?? null,
        timeEnd: options.timeEnd?.getTime() ?? null,
        forward: options.paginationForward ?? null,
        pages: 0,
        requests: 0,
        started: Date.now(),
        got: [],
        error: null,
      };
      // One request a page, and one more for the empty page that ends a
      // query js-waku pages to its end (none when its caller stops early).
      let ended = false;
      try {
        for await (const page of queryPerPage(options, decoders, peerId)) {
          const messages = await Promise.all(page);
          record.pages += 1;
          for (const m of messages) {
            if (!m) continue;
            record.got.push({ hash: m.hashStr, sdsId: sdsIdOf(m) });
            participant.arrived(`store-${record.kind}`, m);
          }
          yield messages.map((m) => Promise.resolve(m));
        }
        ended = true;
      } catch (error) {
        record.error = String(error);
        ended = true;
        throw error;
      } finally {
        record.requests = record.pages + (ended ? 1 : 0);
        record.ended = Date.now();
        emit(record);
      }
    };
    const subscribe = this.node.filter.subscribe.bind(this.node.filter);
    this.node.filter.subscribe = (decoders, callback) =>
      subscribe(decoders, async (message) => {
        this.arrived("filter", message);
        await callback(message);
      });
  }

  arrived(via, message) {
    const id = sdsIdOf(message);
    if (id === null) return;
    const list = this.arrivals.get(id) ?? [];
    list.push({ via, hash: message.hashStr, at: Date.now() });
    this.arrivals.set(id, list);
  }

  listen() {
    const channel = this.channel;
    channel.addEventListener("message-received", (event) => {
      const message = event.detail;
      const id = ReliableChannel.getMessageId(message.payload);
      const entry = this.inbox.get(id) ?? { id, text: Buffer.from(message.payload).toString(), count: 0 };
      entry.count += 1;
      this.inbox.set(id, entry);
    });
    channel.addEventListener("sending-message-irrecoverable-error", (event) => {
      this.errors.push({ what: "irrecoverable send", detail: event.detail });
    });
    channel.messageChannel.addEventListener(MessageChannelEvent.OutMessageSent, (event) => {
      const message = event.detail;
      const mine = this.sent.find((s) => s.id === message.messageId);
      if (mine) mine.hint = hex(message.retrievalHint);
    });
    channel.messageChannel.addEventListener(MessageChannelEvent.InMessageDelivered, (event) => {
      this.deliveries.set(event.detail, (this.deliveries.get(event.detail) ?? 0) + 1);
    });
    channel.messageChannel.addEventListener(MessageChannelEvent.InMessageMissing, (event) => {
      for (const { messageId, retrievalHint } of event.detail) {
        if (!this.missing.has(messageId)) this.missing.set(messageId, hex(retrievalHint));
      }
    });
    channel.messageChannel.addEventListener(MessageChannelEvent.InMessageLost, (event) => {
      this.irretrievable.push(...event.detail.map(({ messageId }) => messageId));
    });
    channel.messageChannel.addEventListener(MessageChannelEvent.ErrorTask, (event) => {
      this.errors.push({ what: "sds task", detail: String(event.detail?.error) });
    });
  }

  send(text) {
    const payload = new TextEncoder().encode(text);
    const id = this.channel.send(payload);
    this.sent.push({ id, text, hint: null });
    return id;
  }

  wasSent(id) {
    return this.sent.find((s) => s.id === id)?.hint != null;
  }

  async goOffline() {
    this.offline = true;
    await Promise.all(this.node.libp2p.getConnections().map((c) => c.close().catch(() => c.abort(new Error("offline")))));
  }

  goOnline() {
    this.offline = false;
  }

  connectedTo(peerIds) {
    const peers = new Set(this.node.libp2p.getPeers().map((p) => p.toString()));
    return peerIds.every((p) => peers.has(p));
  }

  report() {
    return {
      peerId: this.node.libp2p.peerId.toString(),
      sent: this.sent,
      inbox: [...this.inbox.values()],
      deliveries: Object.fromEntries(this.deliveries),
      localHistory: this.channel.messageChannel.localHistory.slice(0).map((m) => m.messageId),
      missing: [...this.missing].map(([id, hint]) => ({ id, hint })),
      irretrievable: this.irretrievable,
      arrivals: Object.fromEntries(this.arrivals),
      errors: this.errors,
    };
  }

  async stop() {
    this.channel?.stop();
    await this.node?.stop();
  }
}

async function waitUntil(condition, what, deadline) {
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`);
    await sleep(POLL_MS);
  }
}

// Delivered by SDS: in the participant's log (its causal history is complete).
function has(participant, ids) {
  const log = new Set(participant.channel.messageChannel.localHistory.slice(0).map((m) => m.messageId));
  return ids.every((id) => log.has(id));
}

async function main() {
  const cfg = await readConfig();
  cfg.timeoutMs ??= 120_000;
  const deadline = Date.now() + cfg.timeoutMs;
  const gap = cfg.sendGapMs ?? 200;
  const alice = new Participant("alice", cfg);
  const bob = new Participant("bob", cfg);
  const participants = [alice, bob];
  const timer = setTimeout(() => {
    emit({ event: "error", error: `timeout after ${cfg.timeoutMs} ms`, state: state() });
    process.exit(1);
  }, cfg.timeoutMs + 5_000);
  const state = () => Object.fromEntries(participants.filter((p) => p.channel).map((p) => [p.name, p.report()]));
  const servicePeers = [cfg.storePeer, cfg.filterPeer].map((a) => multiaddr(a).getPeerId());
  let offlineAt = null;
  let onlineAt = null;
  try {
    await Promise.all(participants.map((p) => p.start()));
    await waitUntil(() => participants.every((p) => p.ready()), "both subscribed and queried the store once", deadline);
    emit({ event: "ready", participants: Object.fromEntries(participants.map((p) => [p.name, p.node.libp2p.peerId.toString()])) });

    emit({ event: "phase", phase: "before", at: Date.now() });
    const first = { alice: [], bob: [] };
    for (let i = 0; i < cfg.before; i += 1) {
      for (const p of participants) first[p.name].push(p.send(`${p.name} before ${i}`));
      await sleep(gap);
    }
    await waitUntil(() => has(bob, first.alice) && has(alice, first.bob), "both saw each other's first messages", deadline);

    await bob.goOffline();
    offlineAt = Date.now();
    emit({ event: "phase", phase: "offline", at: offlineAt });
    await waitUntil(() => bob.node.libp2p.getConnections().length === 0, "bob has no connection", deadline);
    const missed = [];
    for (let i = 0; i < cfg.whileOffline; i += 1) {
      missed.push(alice.send(`alice while bob offline ${i}`));
      await sleep(gap);
    }
    await waitUntil(() => missed.every((id) => alice.wasSent(id)), "alice's messages were pushed", deadline);
    await sleep(Math.max(0, offlineAt + (cfg.offlineMs ?? 0) - Date.now()));
    if (missed.some((id) => bob.arrivals.has(id))) throw new Error("bob received a message while offline");

    bob.goOnline();
    onlineAt = Date.now();
    emit({ event: "phase", phase: "online", at: onlineAt });
    await waitUntil(() => bob.connectedTo(servicePeers), "bob reconnected to both service nodes", deadline);

    emit({ event: "phase", phase: "after", at: Date.now() });
    const last = { alice: [], bob: [] };
    for (let i = 0; i < cfg.after; i += 1) {
      for (const p of participants) last[p.name].push(p.send(`${p.name} after ${i}`));
      await sleep(gap);
    }
    const aliceAll = [...first.alice, ...missed, ...last.alice];
    const bobAll = [...first.bob, ...last.bob];
    await waitUntil(() => has(bob, aliceAll) && has(alice, bobAll), "each has every message of the other", deadline);
    await sleep(cfg.settleMs ?? 3000);
    emit({ event: "phase", phase: "settled", at: Date.now() });
    emit({ event: "done", participants: state(), offlineAt, onlineAt, missed });
  } catch (error) {
    emit({ event: "error", error: String(error?.stack ?? error), state: state(), offlineAt, onlineAt });
    throw error;
  } finally {
    clearTimeout(timer);
    await Promise.all(participants.map((p) => p.stop().catch(() => {})));
  }
}

main().then(
  () => process.exit(0),
  () => process.exit(1),
);
