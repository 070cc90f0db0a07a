#!/usr/bin/env node
// Negentropy (NIP-77, protocol v1) between two in-process peers: the yardstick that our own
// set reconciliation (tests/bench/bench_recon.py) is recorded beside in docs/benchmarks.md.
//
//   node tests/bench/negentropy_bench.mjs --n N --d D [--seed S] [--frame-limit BYTES]
//
// Builds N items (32-byte ids that are sha256 digests, as message CIDs' are, with timestamps
// in seconds spread over one year), removes D/2 of them from the initiator's copy and D - D/2
// from the responder's, runs the real protocol between two Negentropy instances passing the
// encoded messages back and forth until the initiator is done, and prints one line:
//
//   negentropy: n=N d=D round_trips=R bytes=B seconds=S exact=yes|no
//
// R counts initiator message -> responder reply; B is every message both sides sent, in the
// protocol's binary encoding (NIP-77 carries these as hex: twice as many characters); S is
// the wall time of the exchange alone. Exit status 1 when exact=no, 2 on bad arguments.
// Deterministic for a given --seed. Needs `npm ci` in interop/.
//
// Both peers run in one thread with no network, so S is the CPU of both sides added up.
//
// The implementation is Doug Hoyte's reference JavaScript negentropy as shipped (ported to
// TypeScript) inside the npm package applesauce-relay, pinned in interop/package.json. Its
// Negentropy plays both roles. nostr-tools' nip77 plays only the client's: as a responder it
// never answers an id list with its own, so its initiator misses differences and the byte
// count comes out low. @nostr-dev-kit/sync is faithful too, but brings NDK and with it a
// dependency under a non-open-source licence.

import { createHash } from 'node:crypto';
import { createRequire } from 'node:module';
import { performance } from 'node:perf_hooks';
import { pathToFileURL } from 'node:url';

const YEAR_SECONDS = 365 * 24 * 3600;
const FIRST_TIMESTAMP = 1_704_067_200; // 2024-01-01T00:00:00Z; any fixed origin would do
const ID_SIZE = 32;
// A real exchange at n=1M needs a handful; this only stops a runaway loop.
const MAX_ROUND_TRIPS = 10_000;

class UsageError extends Error {}

function parseArgs(argv) {
  // frameLimit 0 is the library's default: Negentropy(storage, frameSizeLimit = 0) means no
  // limit, so each side answers every open range in one message (fewest round trips).
  // applesauce's own relay sync passes no limit either; the library refuses 1..4095. Under a
  // limit each cut-short message ends with the fingerprint of everything after the cut, which
  // this storage (a sorted vector, no fingerprint tree) sums item by item: O(n) a message.
  const args = { n: null, d: null, seed: '1', frameLimit: 0 };
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i];
    const value = argv[i + 1];
    if (value === undefined) throw new UsageError(`${flag} needs a value`);
    i++;
    if (flag === '--n') args.n = nonNegativeInt(flag, value);
    else if (flag === '--d') args.d = nonNegativeInt(flag, value);
    else if (flag === '--seed') args.seed = value;
    else if (flag === '--frame-limit') args.frameLimit = nonNegativeInt(flag, value);
    else throw new UsageError(`unknown argument ${flag}`);
  }
  if (args.n === null || args.d === null) throw new UsageError('--n and --d are required');
  if (args.n < 1) throw new UsageError('--n must be at least 1');
  if (args.d > args.n) throw new UsageError('--d cannot exceed --n');
  if (args.frameLimit !== 0 && args.frameLimit < 4096) {
    throw new UsageError('--frame-limit must be 0 (no limit) or at least 4096 (the library minimum)');
  }
  return args;
}

function nonNegativeInt(flag, text) {
  if (!/^\d+$/.test(text)) throw new UsageError(`${flag} wants a non-negative integer, got ${text}`);
  return Number(text);
}

/** Deterministic bytes: sha256(label, seed, block counter), consumed 32 bytes at a time. */
class DigestStream {
  constructor(label, seed) {
    this.prefix = `${label}\0${seed}\0`;
    this.counter = 0;
    this.block = new Uint8Array(0);
    this.offset = 0;
  }

  nextDigest() {
    const digest = createHash('sha256').update(this.prefix + this.counter++).digest();
    return new Uint8Array(digest.buffer, digest.byteOffset, ID_SIZE);
  }

  nextUint32() {
    if (this.offset === this.block.length) {
      this.block = this.nextDigest();
      this.offset = 0;
    }
    const b = this.block;
    const o = this.offset;
    this.offset += 4;
    return (b[o] * 0x1000000 + (b[o + 1] << 16) + (b[o + 2] << 8) + b[o + 3]) >>> 0;
  }

  /** Uniform integer in [0, bound); the bias of the modulo is below bound / 2**32. */
  below(bound) {
    return this.nextUint32() % bound;
  }
}

/** The common history of both peers: ids in creation order and their timestamps. */
function buildUniverse(n, seed) {
  const ids = new Uint8Array(n * ID_SIZE);
  const idStream = new DigestStream('p2psync negentropy bench ids', seed);
  for (let i = 0; i < n; i++) ids.set(idStream.nextDigest(), i * ID_SIZE);
  // Arrivals uniform over the year, sorted: what a Poisson stream of messages looks like.
  // Several items may share a second, as real messages do; negentropy orders them by id.
  const timeStream = new DigestStream('p2psync negentropy bench times', seed);
  const timestamps = new Float64Array(n);
  for (let i = 0; i < n; i++) timestamps[i] = FIRST_TIMESTAMP + timeStream.below(YEAR_SECONDS);
  timestamps.sort();
  return { ids, timestamps };
}

/** d distinct item indexes (partial Fisher-Yates): the first half leave the initiator. */
function pickDifferences(n, d, seed) {
  const stream = new DigestStream('p2psync negentropy bench differences', seed);
  const order = new Uint32Array(n);
  for (let i = 0; i < n; i++) order[i] = i;
  for (let i = 0; i < d; i++) {
    const j = i + stream.below(n - i);
    const t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  const half = Math.floor(d / 2);
  return { missingAtInitiator: order.slice(0, half), missingAtResponder: order.slice(half, d) };
}

function buildStorage(StorageVector, universe, missing) {
  const absent = new Set(missing);
  const storage = new StorageVector();
  const n = universe.timestamps.length;
  for (let i = 0; i < n; i++) {
    if (absent.has(i)) continue;
    // slice, not subarray: the library's fingerprint reads id.buffer from offset 0, so each
    // id must own its ArrayBuffer. Each peer gets its own copies, as two machines would.
    storage.insert(universe.timestamps[i], universe.ids.slice(i * ID_SIZE, (i + 1) * ID_SIZE));
  }
  return storage;
}

function hex(bytes) {
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString('hex');
}

function sameIdSet(found, universe, indexes) {
  if (found.length !== indexes.length) return false;
  const expected = new Set();
  for (const i of indexes) expected.add(hex(universe.ids.subarray(i * ID_SIZE, (i + 1) * ID_SIZE)));
  const seen = new Set(found.map(hex));
  if (seen.size !== found.length) return false;
  for (const id of seen) if (!expected.has(id)) return false;
  return true;
}

async function loadNegentropy() {
  // The classes are not in applesauce-relay's exports map, only its sync wrapper is; that
  // wrapper imports them from ./lib/negentropy.js beside it, and so do we.
  const interop = createRequire(new URL('../../interop/package.json', import.meta.url));
  let wrapper;
  try {
    wrapper = interop.resolve('applesauce-relay/negentropy');
  } catch {
    throw new UsageError('applesauce-relay is not installed: run `npm ci` in interop/');
  }
  return import(new URL('./lib/negentropy.js', pathToFileURL(wrapper)).href);
}

async function reconcile(Negentropy, initiatorStorage, responderStorage, frameLimit) {
  const initiator = new Negentropy(initiatorStorage, frameLimit);
  const responder = new Negentropy(responderStorage, frameLimit);
  // Binary messages and ids: the hex that NIP-77 puts on the wire is transport, not protocol.
  initiator.wantUint8ArrayOutput = true;
  responder.wantUint8ArrayOutput = true;

  const haveIds = [];
  const needIds = [];
  let roundTrips = 0;
  let bytes = 0;
  const started = performance.now();
  let query = await initiator.initiate();
  while (query !== null) {
    if (roundTrips === MAX_ROUND_TRIPS) throw new Error(`no end after ${MAX_ROUND_TRIPS} round trips`);
    // Each side gets a copy of the bytes, never an object the other side still holds.
    bytes += query.length;
    const [reply] = await responder.reconcile(query.slice());
    roundTrips++;
    bytes += reply.length;
    const [next, have, need] = await initiator.reconcile(reply.slice());
    for (const id of have) haveIds.push(id);
    for (const id of need) needIds.push(id);
    query = next;
  }
  const seconds = (performance.now() - started) / 1000;
  return { roundTrips, bytes, seconds, haveIds, needIds };
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const { NegentropyStorageVector, Negentropy } = await loadNegentropy();

  const universe = buildUniverse(args.n, args.seed);
  const { missingAtInitiator, missingAtResponder } = pickDifferences(args.n, args.d, args.seed);
  const initiatorStorage = buildStorage(NegentropyStorageVector, universe, missingAtInitiator);
  const responderStorage = buildStorage(NegentropyStorageVector, universe, missingAtResponder);
  // Not timed: seal() sorts the items and checks for duplicates, a one-off cost of building
  // the storage (a real peer keeps its index sorted), not of reconciling.
  initiatorStorage.seal();
  responderStorage.seal();

  const run = await reconcile(Negentropy, initiatorStorage, responderStorage, args.frameLimit);
  // haveIds: the initiator holds them, the responder does not; needIds the other way round.
  const exact =
    sameIdSet(run.haveIds, universe, missingAtResponder) &&
    sameIdSet(run.needIds, universe, missingAtInitiator);
  console.log(
    `negentropy: n=${args.n} d=${args.d} round_trips=${run.roundTrips} bytes=${run.bytes} ` +
      `seconds=${run.seconds.toFixed(3)} exact=${exact ? 'yes' : 'no'}`,
  );
  return exact ? 0 : 1;
}

main().then(
  (status) => {
    process.exitCode = status;
  },
  (err) => {
    if (err instanceof UsageError) {
      console.error(`negentropy_bench: ${err.message}`);
      console.error('usage: node tests/bench/negentropy_bench.mjs --n N --d D [--seed S] [--frame-limit BYTES]');
      process.exitCode = 2;
    } else {
      console.error(`negentropy_bench: ${err.stack ?? err}`);
      process.exitCode = 1;
    }
  },
);
