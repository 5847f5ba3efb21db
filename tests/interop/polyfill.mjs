// Node 20 lacks Promise.withResolvers (added in Node 22), which libp2p 2.x
// (it-queue, mortice, peer-store) calls at run time. Imported first by the
// scripts so that they also run on the system Node 20; the pinned npm
// package `node` (22.x, node_modules/.bin/node) does not need it.
if (typeof Promise.withResolvers !== "function") {
  Promise.withResolvers = function withResolvers() {
    let resolve;
    let reject;
    const promise = new Promise((res, rej) => {
      resolve = res;
      reject = rej;
    });
    return { promise, resolve, reject };
  };
}
