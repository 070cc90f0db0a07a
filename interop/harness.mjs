#!/usr/bin/env node
// The reference DWN (dwn-sdk-js 0.5.2) as a p2psync pipe:
//   node interop/harness.mjs --store DIR
// reads one JSON request per stdin line and writes exactly one JSON reply per stdout line,
// in order. See interop/README.md for the protocol.

import { createInterface } from 'node:readline';

import { handleLine, openReferenceDwn } from './lib/reference.mjs';

// stdout carries the protocol only: route anything a library prints to stderr.
for (const name of ['log', 'info', 'debug', 'warn']) {
  console[name] = (...args) => process.stderr.write(args.map(String).join(' ') + '\n');
}

function parseArgs(argv) {
  const args = { store: undefined };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--store' && i + 1 < argv.length) {
      args.store = argv[++i];
    } else if (argv[i].startsWith('--store=')) {
      args.store = argv[i].slice('--store='.length);
    } else {
      throw new Error(`unknown argument: ${argv[i]}`);
    }
  }
  if (args.store === undefined) {
    throw new Error('usage: harness.mjs --store DIR');
  }
  return args;
}

function writeLine(obj) {
  return new Promise((resolve) => {
    if (process.stdout.write(JSON.stringify(obj) + '\n')) {
      resolve();
    } else {
      process.stdout.once('drain', resolve);
    }
  });
}

async function main() {
  let args;
  try {
    args = parseArgs(process.argv.slice(2));
  } catch (e) {
    process.stderr.write(`${e.message}\n`);
    process.exit(2);
  }
  const dwn = await openReferenceDwn(args.store);
  // `for await` pulls the next line only after the previous reply is written, so requests
  // are processed strictly one at a time, in order.
  const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
  for await (const line of lines) {
    if (line.trim() === '') {
      continue;
    }
    let reply;
    try {
      reply = await handleLine(dwn, line);
    } catch (e) {
      reply = { cid: null, status: { code: 500, detail: `harness error: ${e?.message ?? String(e)}` } };
    }
    await writeLine(reply);
  }
  await dwn.close();
}

main().catch((e) => {
  process.stderr.write(`harness failed: ${e?.stack ?? String(e)}\n`);
  process.exit(1);
});
