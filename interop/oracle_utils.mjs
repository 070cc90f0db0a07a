// Differential oracle for p2psync's small DWN utilities (dataCid, URL normalization,
// timestamps). It asks the reference DWN (dwn-sdk-js 0.5.2) and prints what it answers, so
// the Python tests can compare. Run with cwd = interop/ so the package resolves.
//
//   node oracle_utils.mjs datacid        stdin: {"files": [path, ...], "stream": bool}
//                                        stdout: [cid, ...]
//   node oracle_utils.mjs datacid-params stdin: {"files": [...], "chunkSize": n, "maxChildren": n}
//                                        stdout: [cid, ...] from the importer itself with a
//                                        small chunk size and fan-out (deep trees, cheaply)
//   node oracle_utils.mjs url            stdin: [string, ...]
//                                        stdout: [{normalized, normalizeError, schemaNormalized,
//                                                  protocolCheck, schemaCheck}, ...]
//   node oracle_utils.mjs time           stdin: [string, ...]
//                                        stdout: [{check, epochNs, canonical}, ...]
//   node oracle_utils.mjs time-offset    stdin: [[timestamp, seconds], ...]
//                                        stdout: [string | {error}, ...]
//
// Error results carry the DwnError code when there is one, else the JS error's name, so a
// test can tell a refusal with a code from a crash.

import { createReadStream, readFileSync } from 'node:fs';
import { Readable } from 'node:stream';

// Each mode loads only the reference module it needs, by file URL: the URL helpers are not
// re-exported by the package index (whose "exports" map hides deep paths), and loading the
// whole SDK costs a second of start-up per run.
function referenceModule(name) {
  return import(
    new URL(`./node_modules/@tbd54566975/dwn-sdk-js/dist/esm/src/utils/${name}.js`, import.meta.url)
  );
}

function errorCode(err) {
  return err && typeof err.code === 'string' ? err.code : `${err?.name ?? 'Error'}`;
}

function outcome(fn) {
  try {
    fn();
    return 'ok';
  } catch (err) {
    return errorCode(err);
  }
}

async function readStdinJson() {
  const parts = [];
  for await (const part of process.stdin) {
    parts.push(part);
  }
  return JSON.parse(Buffer.concat(parts).toString('utf8'));
}

async function dataCids(request) {
  const { Cid } = await referenceModule('cid');
  const results = [];
  for (const path of request.files) {
    if (request.stream) {
      // Feed the file as a readable stream in odd-sized pieces, as a socket would.
      const stream = Readable.from(createReadStream(path, { highWaterMark: 65521 }));
      results.push(await Cid.computeDagPbCidFromStream(stream));
    } else {
      results.push(await Cid.computeDagPbCidFromBytes(new Uint8Array(readFileSync(path))));
    }
  }
  return results;
}

// Blocks are only hashed, never kept: the importer needs somewhere to put them.
const discardingBlockstore = { put: async (cid) => cid };

async function dataCidsWithParams(request) {
  const { importer } = await import('ipfs-unixfs-importer');
  const { fixedSize } = await import('ipfs-unixfs-importer/chunker');
  const { balanced } = await import('ipfs-unixfs-importer/layout');
  const results = [];
  for (const path of request.files) {
    const options = {
      cidVersion : 1,
      chunker    : fixedSize({ chunkSize: request.chunkSize }),
      layout     : balanced({ maxChildrenPerNode: request.maxChildren }),
    };
    let last;
    for await (last of importer([{ content: readFileSync(path) }], discardingBlockstore, options)) {
      // the root comes last
    }
    results.push(last.cid.toString());
  }
  return results;
}

async function urlResults(inputs) {
  const urlModule = await referenceModule('url');
  return inputs.map((input) => {
    let normalized = null;
    let normalizeError = null;
    try {
      normalized = urlModule.normalizeProtocolUrl(input);
    } catch (err) {
      normalizeError = errorCode(err);
    }
    let schemaNormalized = null;
    try {
      schemaNormalized = urlModule.normalizeSchemaUrl(input);
    } catch (err) {
      schemaNormalized = { error: errorCode(err) };
    }
    return {
      normalized,
      normalizeError,
      schemaNormalized,
      protocolCheck : outcome(() => urlModule.validateProtocolUrlNormalized(input)),
      schemaCheck   : outcome(() => urlModule.validateSchemaUrlNormalized(input)),
    };
  });
}

async function timeResults(inputs) {
  const { Time } = await referenceModule('time');
  const { Temporal } = await import('@js-temporal/polyfill');
  return inputs.map((input) => {
    const check = outcome(() => Time.validateTimestamp(input));
    let epochNs = null;
    let canonical = null;
    if (check === 'ok') {
      const instant = Temporal.Instant.from(input);
      epochNs = instant.epochNanoseconds.toString();
      canonical = instant.toString({ smallestUnit: 'microseconds' });
    }
    return { check, epochNs, canonical };
  });
}

async function timeOffsetResults(inputs) {
  const { Time } = await referenceModule('time');
  return inputs.map(([timestamp, seconds]) => {
    try {
      return Time.createOffsetTimestamp({ seconds }, timestamp);
    } catch (err) {
      return { error: errorCode(err) };
    }
  });
}

const mode = process.argv[2];
const request = await readStdinJson();
let answer;
switch (mode) {
  case 'datacid':
    answer = await dataCids(request);
    break;
  case 'datacid-params':
    answer = await dataCidsWithParams(request);
    break;
  case 'url':
    answer = await urlResults(request);
    break;
  case 'time':
    answer = await timeResults(request);
    break;
  case 'time-offset':
    answer = await timeOffsetResults(request);
    break;
  default:
    process.stderr.write(`unknown mode: ${mode}\n`);
    process.exit(2);
}
process.stdout.write(JSON.stringify(answer));
