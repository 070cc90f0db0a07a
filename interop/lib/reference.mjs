// The reference DWN (dwn-sdk-js 0.5.2) behind the p2psync pipe protocol.
//
// Shared by the pipe harness (interop/harness.mjs) and the scenario generator
// (interop/gen_scenarios.mjs), so the expectations written into scenario files come from
// exactly the code path the harness runs.

import { createHash } from 'node:crypto';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';

import {
  DataStoreLevel,
  DataStream,
  Dwn,
  EventLogLevel,
  Message,
  MessageStoreLevel,
  ResumableTaskStoreLevel,
} from '@tbd54566975/dwn-sdk-js';
import { DidJwk, DidKey, DidResolverCacheNoop, UniversalResolver } from '@web5/dids';

/** Ops this harness implements; anything else gets a 400 "unsupported op". */
export const SUPPORTED_OPS = new Set(['process', 'query', 'messages']);

// base64url without padding, as the pipe protocol carries data; Node's decoder would
// silently skip junk characters, so the alphabet is checked first.
const BASE64URL = /^[A-Za-z0-9_-]*$/;

/**
 * Opens a reference DWN whose every store lives under `storeDir`, with an offline resolver
 * for did:key and did:jwk only (the default resolver writes ./RESOLVERCACHE and goes to the
 * network for other methods).
 */
export async function openReferenceDwn(storeDir) {
  mkdirSync(storeDir, { recursive: true });
  const messageStore = new MessageStoreLevel({
    blockstoreLocation : join(storeDir, 'MESSAGESTORE'),
    indexLocation      : join(storeDir, 'INDEX'),
  });
  const dataStore = new DataStoreLevel({ blockstoreLocation: join(storeDir, 'DATASTORE') });
  const eventLog = new EventLogLevel({ location: join(storeDir, 'EVENTLOG') });
  const resumableTaskStore = new ResumableTaskStoreLevel({ location: join(storeDir, 'RESUMABLE-TASK-STORE') });
  const didResolver = new UniversalResolver({
    didResolvers : [DidKey, DidJwk],
    cache        : DidResolverCacheNoop,
  });
  return Dwn.create({ messageStore, dataStore, eventLog, resumableTaskStore, didResolver });
}

function badRequest(detail, cid = null) {
  return { cid, status: { code: 400, detail } };
}

/** The message CID as the reference computes it, or null when it cannot be computed. */
async function cidOrNull(message) {
  try {
    return await Message.getCid(message);
  } catch {
    return null;
  }
}

/** CID of a stored message as a query returns it: without `encodedData` and `initialWrite`. */
async function storedMessageCid(entry) {
  const copy = { ...entry };
  delete copy.encodedData;
  delete copy.initialWrite;
  return Message.getCid(copy);
}

async function sha256OfStream(stream) {
  const hash = createHash('sha256');
  for await (const chunk of stream) {
    hash.update(chunk);
  }
  return hash.digest('hex');
}

/**
 * Handles one parsed pipe request against `dwn` and returns the reply object.
 * Never throws: every failure becomes a reply with a status code.
 */
export async function handleRequest(dwn, request) {
  if (request === null || typeof request !== 'object' || Array.isArray(request)) {
    return badRequest('request must be a JSON object');
  }
  const { op, tenant, message, data } = request;
  const messageIsObject = message !== null && typeof message === 'object' && !Array.isArray(message);
  // the CID is reported whenever it can be computed, even for a request refused below
  const cid = messageIsObject ? await cidOrNull(message) : null;
  if (typeof op !== 'string') {
    return badRequest('request.op must be a string', cid);
  }
  if (!SUPPORTED_OPS.has(op)) {
    return badRequest(`unsupported op: ${op}`, cid);
  }
  if (typeof tenant !== 'string') {
    return badRequest('request.tenant must be a string', cid);
  }
  if (op === 'messages') {
    return dumpTenant(dwn, tenant);
  }
  if (!messageIsObject) {
    return badRequest('request.message must be a JSON object');
  }

  let dataStream;
  if (data !== undefined) {
    if (typeof data !== 'string' || !BASE64URL.test(data) || data.length % 4 === 1) {
      return badRequest('request.data must be a base64url string', cid);
    }
    dataStream = DataStream.fromBytes(new Uint8Array(Buffer.from(data, 'base64url')));
  }

  let reply;
  try {
    reply = await dwn.processMessage(tenant, message, { dataStream });
  } catch (e) {
    // The reference throws (instead of replying) on a few internal paths; surface that as a
    // distinct code so a scenario that hits one is noticed rather than silently compared.
    return { cid, status: { code: 500, detail: `reference threw: ${e?.message ?? String(e)}` } };
  }

  const out = { cid, status: { code: reply.status.code, detail: String(reply.status.detail ?? '') } };

  const entryData = reply.entry?.data;
  if (entryData !== undefined) {
    out.data_sha256 = await sha256OfStream(entryData);
  }

  if (op === 'query') {
    const entries = [];
    for (const entry of Array.isArray(reply.entries) ? reply.entries : []) {
      // MessagesQuery lists event-log entries as bare message CIDs.
      if (typeof entry === 'string') {
        entries.push({ cid: entry });
        continue;
      }
      const item = {};
      if (typeof entry.recordId === 'string') {
        item.recordId = entry.recordId;
      }
      item.cid = await storedMessageCid(entry);
      if (entry.initialWrite !== undefined) {
        item.initialWriteCid = await storedMessageCid(entry.initialWrite);
      }
      entries.push(item);
    }
    out.entries = entries;
  }
  return out;
}

/**
 * `op: "messages"`: everything the tenant's stores hold, read straight from them (no DWN
 * message involved), so a test can compare a whole store with the reference's: every stored
 * message as stored (`encodedData` included) with its CID and index key-values, in CID order,
 * with the sha256 and size of the data the data store keeps for it; and the event log's CIDs
 * in log order. `Dwn` keeps its stores in (TypeScript-private) fields; 0.5.2 has no public
 * way to list them.
 */
async function dumpTenant(dwn, tenant) {
  const { messageStore, dataStore, eventLog } = dwn;
  // No filter and no limit: the index iterates every item of the tenant (IndexLevel.query).
  const items = await messageStore.index.query(tenant, [], { sortProperty: 'messageTimestamp' });
  const messages = [];
  for (const { messageCid, indexes } of items) {
    const message = await messageStore.get(tenant, messageCid);
    if (message === undefined) {
      continue;
    }
    const item = { cid: await storedMessageCid(message), message, indexes };
    const { descriptor } = message;
    if (descriptor.interface === 'Records' && descriptor.method === 'Write' && message.encodedData === undefined) {
      const held = await dataStore.get(tenant, message.recordId, descriptor.dataCid);
      if (held !== undefined) {
        item.data_sha256 = await sha256OfStream(held.dataStream);
        item.data_size = held.dataSize;
      }
    }
    messages.push(item);
  }
  messages.sort((a, b) => (a.cid < b.cid ? -1 : a.cid > b.cid ? 1 : 0));
  const { events } = await eventLog.getEvents(tenant);
  return { cid: null, status: { code: 200, detail: 'OK' }, messages, events };
}

/**
 * Like `handleRequest` but also hands back the reference's raw reply (for the generator,
 * which needs e.g. the pagination cursor to author the next query).
 */
export async function handleRequestWithRaw(dwn, request) {
  const captured = { raw: undefined };
  const proxy = {
    messageStore   : dwn.messageStore,
    dataStore      : dwn.dataStore,
    eventLog       : dwn.eventLog,
    processMessage : async (...args) => {
      captured.raw = await dwn.processMessage(...args);
      return captured.raw;
    },
  };
  const reply = await handleRequest(proxy, request);
  return { reply, raw: captured.raw };
}

/** Parses one input line and handles it; a malformed line gets a 400 reply. */
export async function handleLine(dwn, line) {
  return (await handleLineWithRaw(dwn, line)).reply;
}

/** handleLine, also returning the reference's raw reply when there was one. */
export async function handleLineWithRaw(dwn, line) {
  let request;
  try {
    request = JSON.parse(line);
  } catch (e) {
    return { reply: badRequest(`malformed JSON request: ${e.message}`), raw: undefined };
  }
  return handleRequestWithRaw(dwn, request);
}
