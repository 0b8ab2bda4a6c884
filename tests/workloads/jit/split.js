// Splits its CPU between two JavaScript functions, hotA 3 ms for every 1 ms
// of hotB on average, and measures the time each really spent (its oracle),
// written to STATS every 200 ms as {"hotA": ns, "hotB": ns}. Each turn's
// length is drawn at random (hotA 2-4 ms, hotB 0.5-1.5 ms): a fixed 4-ms
// rhythm would beat with the sampler's 10.1-ms period, and the samples would
// see the same few phases of it for seconds.
//
// node --perf-basic-prof --no-turbo-inlining split.js SECONDS STATS
'use strict';
const fs = require('fs');

const [seconds, statsPath] = process.argv.slice(2);
const spent = { hotA: 0n, hotB: 0n };
let sink = 0;

function spin(untilNs) {
  let x = sink;
  while (process.hrtime.bigint() < untilNs) {
    for (let i = 0; i < 2000; i++) x = (x * 31 + i) | 0;
  }
  return x;
}

function hotA() {
  const start = process.hrtime.bigint();
  sink = spin(start + BigInt(Math.floor(2e6 + 2e6 * Math.random())));
  spent.hotA += process.hrtime.bigint() - start;
}

function hotB() {
  const start = process.hrtime.bigint();
  sink = spin(start + BigInt(Math.floor(5e5 + 1e6 * Math.random())));
  spent.hotB += process.hrtime.bigint() - start;
}

function writeStats() {
  const text = JSON.stringify({ hotA: spent.hotA.toString(), hotB: spent.hotB.toString() });
  fs.writeFileSync(statsPath + '.tmp', text);
  fs.renameSync(statsPath + '.tmp', statsPath);
}

const end = Date.now() + Number(seconds) * 1000;
let lastWrite = 0;
while (Date.now() < end) {
  hotA();
  hotB();
  if (Date.now() - lastWrite >= 200) {
    writeStats();
    lastWrite = Date.now();
  }
}
writeStats();
