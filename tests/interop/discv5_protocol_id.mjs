// A module hook for discv5_node.mjs: @chainsafe/discv5 writes and checks the
// protocol id "discv5" as a literal in lib/packet/create.js and encode.js and
// has no option for it; Waku's discv5 (33/WAKU2-DISCV5) uses "d5waku". The
// two files are given the wanted id as they load (nothing on disk changes);
// a release that moved the literal makes the load fail instead of silently
// speaking "discv5".
let wanted = "discv5";

export async function initialize(data) {
  wanted = data.protocolId;
}

const PACKET_FILES = /@chainsafe\/discv5\/lib\/packet\/(create|encode)\.js$/;

export async function load(url, context, nextLoad) {
  const loaded = await nextLoad(url, context);
  if (wanted === "discv5" || !PACKET_FILES.test(url)) {
    return loaded;
  }
  const text = typeof loaded.source === "string" ? loaded.source : new TextDecoder().decode(loaded.source);
  const changed = text.replaceAll('"discv5"', JSON.stringify(wanted));
  if (changed === text) {
    throw new Error(`no protocol id literal in ${url}: @chainsafe/discv5 changed`);
  }
  return { ...loaded, source: changed };
}
