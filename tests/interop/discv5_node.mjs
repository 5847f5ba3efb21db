// A @chainsafe/discv5 node on loopback for the discv5 interop tests.
// node discv5_node.mjs [--protocol-id d5waku] [--bootnode ENR ...] [--lookup] [--want N] [--seconds N]
// Prints JSON lines: {"enr", "nodeId"} once started; {"event": "session", "nodeId"}
// for each session established; {"found": [enr texts]} after a lookup.
import { register } from "node:module";
import dgram from "node:dgram";

const options = { protocolId: "d5waku", bootnodes: [], lookup: false, seconds: 30, want: 0 };
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
  const name = argv[i];
  if (name === "--protocol-id") options.protocolId = argv[++i];
  else if (name === "--bootnode") options.bootnodes.push(argv[++i]);
  else if (name === "--lookup") options.lookup = true;
  else if (name === "--seconds") options.seconds = Number(argv[++i]);
  else if (name === "--want") options.want = Number(argv[++i]);
  else {
    console.error(`unknown argument ${name}`);
    process.exit(2);
  }
}
const print = (value) => process.stdout.write(JSON.stringify(value) + "\n");

// Before @chainsafe/discv5 is first imported: the hook rewrites it as it loads.
register("./discv5_protocol_id.mjs", import.meta.url, { data: { protocolId: options.protocolId } });
const { Discv5 } = await import("@chainsafe/discv5");
const { SignableENR } = await import("@chainsafe/enr");
const { generateKeyPair } = await import("@libp2p/crypto/keys");
const { multiaddr } = await import("@multiformats/multiaddr");

// A free UDP port: bound by the kernel, released, bound again by discv5.
const probe = dgram.createSocket("udp4");
await new Promise((resolve) => probe.bind(0, "127.0.0.1", resolve));
const port = probe.address().port;
await new Promise((resolve) => probe.close(resolve));

const privateKey = await generateKeyPair("secp256k1");
const record = SignableENR.createFromPrivateKey(privateKey);
record.ip = "127.0.0.1";
record.udp = port;
const node = Discv5.create({
  enr: record,
  privateKey,
  bindAddrs: { ip4: multiaddr(`/ip4/127.0.0.1/udp/${port}`) },
  config: { enrUpdate: false },
});
node.sessionService.on("established", (address, enr) => print({ event: "session", nodeId: enr.nodeId }));
await node.start();
print({ enr: node.enr.encodeTxt(), nodeId: node.enr.nodeId });
for (const bootnode of options.bootnodes) {
  node.addEnr(bootnode);
}
setTimeout(async () => {
  await node.stop();
  process.exit(0);
}, options.seconds * 1000);
if (options.lookup) {
  // At least twice (the first walk also opens the sessions the second one
  // uses), then again while fewer than --want records were found (a loaded
  // machine answers some FINDNODEs after the walk's timeout), until 5 s
  // before the end.
  const found = new Set();
  const deadline = Date.now() + Math.max(options.seconds - 5, 1) * 1000;
  for (let walk = 0; walk < 2 || (found.size < options.want && Date.now() < deadline); walk++) {
    for (const enr of await node.findRandomNode()) found.add(enr.encodeTxt());
  }
  print({ found: [...found] });
}
