// Splits its CPU between two JavaScript functions, hotA 3 ms for every 1 ms
// of hotB, and measures the time each really spent (its oracle), written
// to STATS every 200 ms as {"hotA": ns, "hotB": ns}.
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
  sink = spin(start + 3000000n);
  spent.hotA += process.hrtime.bigint() - start;
}

function hotB() {
  const start = process.hrtime.bigint();
  sink = spin(start + 1000000n);
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
