// An independent RLPx peer (@ethereumjs/devp2p 10.0.0) for the RLPx interop test.
//
// Usage:
//   node rlpx_peer.mjs dial enode://<128 hex node id>@127.0.0.1:<port>
//   node rlpx_peer.mjs listen
//
// It runs the RLPx handshake and the Hello exchange, announcing a stand-in
// capability waku/1 (128 message codes, the count status-go registers).
// Once both Hellos are exchanged it sends a waku message (capability code 0,
// payload RLP ["js-status"]) and a Ping, then waits for a waku message from
// the other side (any code) and the Pong, and disconnects with reason 0x08
// (client quitting).
//
// Output: JSON lines on standard output:
//   {"event":"listening","port":N,"id":"<hex>"}         (listen mode only)
//   {"event":"hello","hello":{protocolVersion, clientId, capabilities, port, id}}
//   {"event":"message","code":N,"payload":"<hex>"}      (capability-relative code)
//   {"event":"pong"}
//   {"event":"done"}
//   {"event":"error","error":"..."}
// Exit code 0 after "done", 1 on an error or after the deadline.

import { RLPx, DISCONNECT_REASON, genPrivateKey } from "@ethereumjs/devp2p";
import { RLP } from "@ethereumjs/rlp";
import * as snappy from "snappyjs";

const DEADLINE_MS = 20000;

const toHex = (bytes) => Buffer.from(bytes).toString("hex");
const fromHex = (hex) => Uint8Array.from(Buffer.from(hex, "hex"));
const emit = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");
const fail = (error) => {
  emit({ event: "error", error: String(error && error.stack ? error.stack : error) });
  process.exit(1);
};

const state = { message: false, pong: false, finished: false };

function maybeFinish(peer) {
  if (state.finished || !state.message || !state.pong) return;
  state.finished = true;
  emit({ event: "done" });
  peer.disconnect(DISCONNECT_REASON.CLIENT_QUITTING);
  // Give the Disconnect frame time to leave before the process ends.
  setTimeout(() => process.exit(0), 300);
}

// The stand-in capability: devp2p instantiates it per peer with a send
// function that adds the capability's code offset. Payloads reach it
// decompressed; what it sends must be compressed by itself (as devp2p's own
// ETH protocol does) once the peer announced p2p version >= 5.
class FakeWaku {
  constructor(version, peer, send) {
    this.version = version;
    this._peer = peer;
    this._send = send;
  }

  _handleMessage(code, payload) {
    emit({ event: "message", code, payload: toHex(payload) });
    state.message = true;
    maybeFinish(this._peer);
  }

  sendStatus() {
    let payload = RLP.encode([new TextEncoder().encode("js-status")]);
    if (this._peer.getHelloMessage().protocolVersion >= 5) payload = snappy.compress(payload);
    this._send(0, payload);
  }
}

const mode = process.argv[2];
const rlpx = new RLPx(genPrivateKey(), {
  clientId: new TextEncoder().encode("ethereumjs-devp2p-interop"),
  capabilities: [{ name: "waku", version: 1, length: 128, constructor: FakeWaku }],
  maxPeers: 4,
  timeout: DEADLINE_MS,
});

rlpx.events.on("error", fail);
rlpx.events.on("peer:error", (_peer, err) => fail(err));
rlpx.events.on("peer:added", (peer) => {
  const hello = peer.getHelloMessage();
  emit({
    event: "hello",
    hello: {
      protocolVersion: hello.protocolVersion,
      clientId: hello.clientId,
      capabilities: hello.capabilities,
      port: hello.port,
      id: toHex(hello.id),
    },
  });
  const handlePong = peer._handlePong.bind(peer);
  peer._handlePong = () => {
    handlePong();
    emit({ event: "pong" });
    state.pong = true;
    maybeFinish(peer);
  };
  peer.getProtocols()[0].sendStatus();
  peer._sendPing();
});
rlpx.events.on("peer:removed", (_peer, reason) => {
  if (!state.finished) fail(`peer removed before the exchange finished (reason ${reason})`);
});

setTimeout(() => fail("deadline passed"), DEADLINE_MS);

if (mode === "listen") {
  rlpx.events.once("listening", () => {
    emit({ event: "listening", port: rlpx._server.address().port, id: toHex(rlpx.id) });
  });
  rlpx.listen(0, "127.0.0.1");
} else if (mode === "dial") {
  const match = /^enode:\/\/([0-9a-f]{128})@([^:]+):(\d+)$/.exec(process.argv[3] ?? "");
  if (!match) fail("usage: rlpx_peer.mjs dial enode://<id>@<host>:<port>");
  rlpx
    .connect({ id: fromHex(match[1]), address: match[2], tcpPort: Number(match[3]) })
    .catch(fail);
} else {
  fail("usage: rlpx_peer.mjs dial <enode> | listen");
}
