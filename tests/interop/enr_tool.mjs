// @waku/enr (js-waku's ENR codec) on the command line, for the interop tests.
//
//   node enr_tool.mjs decode <enr:...>   prints the record's fields as JSON
//   node enr_tool.mjs encode             prints a record js-waku signs:
//       waku2 relay+store, rs cluster 16 shards 1 and 32, ip 10.1.2.3,
//       tcp 30303, and a dns4 wss multiaddr; JSON {enr, peerId}
import { EnrCreator, EnrDecoder } from "@waku/enr";
// The encoder is not in the package's exports map: imported by its file.
import { EnrEncoder } from "./node_modules/@waku/enr/dist/encoder.js";
import * as secp from "@noble/secp256k1";
import { multiaddr } from "@multiformats/multiaddr";

const [verb, arg] = process.argv.slice(2);

function describe(enr) {
  return {
    peerId: enr.peerId?.toString(),
    seq: Number(enr.seq),
    ip: enr.ip,
    tcp: enr.tcp,
    ip6: enr.ip6,
    waku2: enr.waku2,
    shardInfo: enr.shardInfo,
    multiaddrs: (enr.multiaddrs ?? []).map((m) => m.toString()),
    locationTcp: enr.getLocationMultiaddr("tcp")?.toString(),
  };
}

if (verb === "decode") {
  const enr = await EnrDecoder.fromString(arg);
  console.log(JSON.stringify(describe(enr)));
} else if (verb === "encode") {
  const privateKey = secp.utils.randomPrivateKey();
  const publicKey = secp.getPublicKey(privateKey, true);
  const enr = EnrCreator.fromPublicKey(publicKey);
  enr.ip = "10.1.2.3";
  enr.tcp = 30303;
  enr.waku2 = { relay: true, store: true, filter: false, lightPush: false };
  enr.set("rs", new Uint8Array([0, 16, 2, 0, 1, 0, 32]));
  enr.multiaddrs = [multiaddr("/dns4/node.example.org/tcp/443/wss")];
  const text = await EnrEncoder.toString(enr, privateKey);
  const back = await EnrDecoder.fromString(text);
  console.log(JSON.stringify({ enr: text, peerId: back.peerId?.toString() }));
} else {
  console.error("usage: node enr_tool.mjs decode <enr> | encode");
  process.exit(2);
}
