// Authoring side of the scenario format: a builder that authors messages with the
// reference's own classes, runs every step through a fresh in-process reference DWN (the
// same code path as interop/harness.mjs), checks the code the author wanted, and records
// what the reference answered as the step's `expect`.

import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import {
  Encoder,
  PermissionGrant,
  PermissionsProtocol,
  ProtocolsConfigure,
  ProtocolsQuery,
  RecordsDelete,
  RecordsQuery,
  RecordsRead,
  RecordsWrite,
  Time,
} from '@tbd54566975/dwn-sdk-js';

import { expandDataGen } from './datagen.mjs';
import { createPersona } from './personas.mjs';
import { handleLineWithRaw, handleRequestWithRaw, openReferenceDwn } from './reference.mjs';

export const SCENARIO_FORMAT = 'p2psync-interop-scenario/1';
export const REFERENCE = '@tbd54566975/dwn-sdk-js@0.5.2';

// Every scenario runs on a logical clock so the files are reproducible; the reference never
// compares message timestamps with the wall clock (grant expiry and revocation are judged
// by message timestamps), so a fixed past epoch behaves like "now".
export const CLOCK_EPOCH = '2024-03-01T00:00:00.000000Z';

// Inline data up to this size is written as base64url; anything larger must use dataGen.
const MAX_INLINE_DATA = 4096;

const personaCache = new Map();

/** A persona shared by all scenarios (keys derived from the name, see personas.mjs). */
export async function persona(name, method = 'key') {
  const key = `${name}/${method}`;
  if (!personaCache.has(key)) {
    personaCache.set(key, await createPersona(name, method));
  }
  return personaCache.get(key);
}

/** Data given inline. */
export function bytes(content) {
  const b = typeof content === 'string' ? Encoder.stringToBytes(content) : content;
  return { bytes: b };
}

/** Data given as JSON text. */
export function json(obj) {
  return { bytes: Encoder.objectToBytes(obj) };
}

/** Data given by the deterministic generator (stored as {"dataGen": {size, seed}}). */
export function gen(size, seed) {
  return { bytes: expandDataGen({ size, seed }), gen: { size, seed } };
}

function didOf(who) {
  return typeof who === 'string' ? who : who.did;
}

function clone(obj) {
  return JSON.parse(JSON.stringify(obj));
}

export class ScenarioBuilder {
  constructor({ name, description, tags = [] }) {
    this.name = name;
    this.description = description;
    this.tags = tags;
    this.steps = [];
    this.personas = new Map();
    this.seconds = 0;
    this.failures = [];
    this.storeDir = mkdtempSync(join(tmpdir(), `gen-${name}-`));
    this.dwn = undefined;
  }

  async open() {
    this.dwn = await openReferenceDwn(this.storeDir);
  }

  async close() {
    await this.dwn?.close();
    rmSync(this.storeDir, { recursive: true, force: true });
  }

  /** Registers (and returns) a persona used by this scenario. */
  async persona(name, method = 'key') {
    const p = await persona(name, method);
    this.personas.set(name, p);
    return p;
  }

  /** Advances the logical clock by `seconds` and returns the new time. */
  tick(seconds = 1) {
    this.seconds += seconds;
    return this.at(0);
  }

  /** The logical time `offsetSeconds` from now (negative: in the past), without moving the clock. */
  at(offsetSeconds) {
    return Time.createOffsetTimestamp({ seconds: this.seconds + offsetSeconds }, CLOCK_EPOCH);
  }

  /**
   * Runs one step through the reference, checks the wanted code, records the step.
   * `data`: undefined (no data stream), or a value from bytes()/json()/gen().
   * Returns { reply, raw } (raw: the reference's own reply object).
   */
  async step({ op = 'process', tenant, message, data, note, want }) {
    if (want === undefined) {
      throw new Error(`${this.name}: step ${this.steps.length} has no wanted code`);
    }
    const step = { op, tenant: didOf(tenant), message: clone(message) };
    let wire;
    if (data !== undefined) {
      if (data.gen !== undefined) {
        step.dataGen = { ...data.gen };
      } else {
        if (data.bytes.length > MAX_INLINE_DATA) {
          throw new Error(`${this.name}: inline data of ${data.bytes.length} bytes: use gen()`);
        }
        step.data = Encoder.bytesToBase64Url(data.bytes);
      }
      wire = Encoder.bytesToBase64Url(data.bytes);
    }
    const request = { op, tenant: step.tenant, message: clone(message) };
    if (wire !== undefined) {
      request.data = wire;
    }
    const { reply, raw } = await handleRequestWithRaw(this.dwn, request);

    const expect = { code: reply.status.code };
    if (reply.cid !== null) {
      expect.cid = reply.cid;
    }
    if (reply.data_sha256 !== undefined) {
      expect.data_sha256 = reply.data_sha256;
    }
    if (reply.entries !== undefined) {
      expect.entries = reply.entries;
    }
    step.expect = expect;
    if (note !== undefined) {
      step.note = note;
    }
    if (process.env.GEN_VERBOSE) {
      process.stdout.write(`  [${this.name} #${this.steps.length}] ${reply.status.code} ${note ?? ''} :: ${String(reply.status.detail).slice(0, 160)}\n`);
    }
    if (reply.status.code !== want) {
      this.failures.push(
        `step ${this.steps.length} (${note ?? ''}): wanted ${want}, reference said ` +
        `${reply.status.code} ${reply.status.detail}`);
    }
    this.steps.push(step);
    return { reply, raw };
  }

  /** Sends `line` verbatim (for malformed requests); recorded as {"raw": line}. */
  async raw(line, { note, want }) {
    const { reply } = await handleLineWithRaw(this.dwn, line);
    const step = { raw: line, expect: { code: reply.status.code } };
    if (reply.cid !== null) {
      step.expect.cid = reply.cid;
    }
    if (note !== undefined) {
      step.note = note;
    }
    if (reply.status.code !== want) {
      this.failures.push(`step ${this.steps.length} (${note ?? ''}): wanted ${want}, reference said ${reply.status.code} ${reply.status.detail}`);
    }
    this.steps.push(step);
    return { reply };
  }

  /** Sends an authored message (from write()/update()/...) with or without its data. */
  async send(tenant, authored, { note, want, withData = true, data } = {}) {
    const payload = data ?? (withData ? authored.data : undefined);
    return this.step({ op: 'process', tenant, message: authored.message, data: payload, note, want });
  }

  async process(tenant, message, opts = {}) {
    return this.step({ op: 'process', tenant, message, ...opts });
  }

  async query(tenant, message, opts = {}) {
    return this.step({ op: 'query', tenant, message, ...opts });
  }

  toJSON() {
    const personas = {};
    for (const [name, p] of [...this.personas.entries()].sort()) {
      personas[name] = { did: p.did, method: p.method };
    }
    return {
      format      : SCENARIO_FORMAT,
      name        : this.name,
      description : this.description,
      reference   : REFERENCE,
      tags        : this.tags,
      personas,
      steps       : this.steps,
    };
  }
}

/** Serializes a scenario: header pretty-printed, one step per line (small, reviewable diffs). */
export function serializeScenario(scenario) {
  const { steps, ...header } = scenario;
  const head = JSON.stringify(header, null, 2);
  const lines = steps.map((s) => '    ' + JSON.stringify(s));
  const body = lines.length === 0 ? '[]' : '[\n' + lines.join(',\n') + '\n  ]';
  return head.slice(0, -2) + ',\n  "steps": ' + body + '\n}\n';
}

// ---------------------------------------------------------------------------------------
// Authoring helpers: thin wrappers over the reference's classes that take every timestamp
// from the scenario clock. Each returns { message, data?, ... }.

/** RecordsWrite.create: an initial write. `data` from bytes()/json()/gen(). */
export async function write(S, { author, data, timestamp, dateCreated, published, datePublished, dataFormat = 'text/plain', ...rest }) {
  const ts = timestamp ?? S.tick();
  const options = {
    ...rest,
    dataFormat,
    signer           : rest.signer ?? author?.signer,
    messageTimestamp : ts,
    dateCreated      : dateCreated ?? ts,
  };
  if (rest.dataCid === undefined) {
    options.data = data.bytes;
  }
  if (published !== undefined) {
    options.published = published;
  }
  if (published === true) {
    options.datePublished = datePublished ?? ts;
  }
  const recordsWrite = await RecordsWrite.create(options);
  return { message: recordsWrite.message, data, recordsWrite, recordId: recordsWrite.message.recordId, contextId: recordsWrite.message.contextId };
}

/** RecordsWrite.createFrom: a newer write of the record of `from` (a message). */
export async function update(S, { author, from, data, timestamp, published, datePublished, ...rest }) {
  const ts = timestamp ?? S.tick();
  const options = {
    ...rest,
    recordsWriteMessage : from,
    signer              : rest.signer ?? author.signer,
    messageTimestamp    : ts,
  };
  if (data !== undefined) {
    options.data = data.bytes;
  }
  if (published !== undefined) {
    options.published = published;
  }
  // createFrom stamps the wall clock when a record becomes published: give it our time.
  const becomesPublished = published === true && from.descriptor.published !== true;
  if (datePublished !== undefined || becomesPublished) {
    options.datePublished = datePublished ?? ts;
  }
  const recordsWrite = await RecordsWrite.createFrom(options);
  return { message: recordsWrite.message, data, recordsWrite, recordId: recordsWrite.message.recordId };
}

export async function del(S, { author, recordId, timestamp, ...rest }) {
  const recordsDelete = await RecordsDelete.create({
    ...rest,
    recordId,
    signer           : rest.signer ?? author.signer,
    messageTimestamp : timestamp ?? S.tick(),
  });
  return { message: recordsDelete.message };
}

export async function read(S, { author, filter, timestamp, ...rest }) {
  const recordsRead = await RecordsRead.create({
    ...rest,
    filter,
    signer           : rest.signer ?? author?.signer,
    messageTimestamp : timestamp ?? S.tick(),
  });
  return { message: recordsRead.message };
}

export async function query(S, { author, filter, timestamp, ...rest }) {
  const recordsQuery = await RecordsQuery.create({
    ...rest,
    filter,
    signer           : rest.signer ?? author?.signer,
    messageTimestamp : timestamp ?? S.tick(),
  });
  return { message: recordsQuery.message };
}

export async function configure(S, { author, definition, timestamp, ...rest }) {
  const protocolsConfigure = await ProtocolsConfigure.create({
    ...rest,
    definition,
    signer           : rest.signer ?? author.signer,
    messageTimestamp : timestamp ?? S.tick(),
  });
  return { message: protocolsConfigure.message };
}

export async function protocolsQuery(S, { author, filter, timestamp, ...rest }) {
  const pq = await ProtocolsQuery.create({
    ...rest,
    filter,
    signer           : rest.signer ?? author?.signer,
    messageTimestamp : timestamp ?? S.tick(),
  });
  return { message: pq.message };
}

/**
 * PermissionsProtocol.createGrant from `grantor` to `grantee`, valid for `seconds` from its
 * own timestamp unless `dateExpires` is given. Returns the grant's write, its data, its id
 * (recordId) and the data-encoded form used as a delegated grant.
 */
export async function grant(S, { grantor, grantee, scope, seconds = 3600, dateExpires, timestamp, ...rest }) {
  const dateGranted = timestamp ?? S.tick();
  const out = await PermissionsProtocol.createGrant({
    ...rest,
    signer      : grantor.signer,
    grantedTo   : didOf(grantee),
    dateGranted,
    dateExpires : dateExpires ?? Time.createOffsetTimestamp({ seconds }, dateGranted),
    scope,
  });
  const permissionGrant = await PermissionGrant.parse(out.dataEncodedMessage);
  return {
    message            : out.recordsWrite.message,
    data               : { bytes: out.permissionGrantBytes },
    id                 : out.recordsWrite.message.recordId,
    dataEncodedMessage : out.dataEncodedMessage,
    permissionGrant,
  };
}

/**
 * A permission request shaped as PermissionsProtocol.createRequest shapes it (JSON data,
 * protocol tag when scoped to a protocol), with both timestamps from the scenario clock
 * (createRequest in 0.5.2 leaves dateCreated to the wall clock).
 */
export async function permissionRequest(S, { requester, scope, delegated = false, description, conditions, timestamp }) {
  const ts = timestamp ?? S.tick();
  const requestData = { description, delegated, scope, conditions };
  for (const k of Object.keys(requestData)) {
    if (requestData[k] === undefined) {
      delete requestData[k];
    }
  }
  const requestBytes = Encoder.objectToBytes(requestData);
  const recordsWrite = await RecordsWrite.create({
    signer           : requester.signer,
    protocol         : PermissionsProtocol.uri,
    protocolPath     : PermissionsProtocol.requestPath,
    dataFormat       : 'application/json',
    data             : requestBytes,
    tags             : scope.protocol !== undefined ? { protocol: scope.protocol } : undefined,
    messageTimestamp : ts,
    dateCreated      : ts,
  });
  return { message: recordsWrite.message, data: { bytes: requestBytes }, id: recordsWrite.message.recordId };
}

/**
 * A revocation of `grantRecord` (from grant()), shaped as PermissionsProtocol.createRevocation
 * shapes it, but with its timestamp from the scenario clock (createRevocation in 0.5.2
 * always uses the wall clock).
 */
export async function revoke(S, { grantor, grantRecord, timestamp, description, tags }) {
  const ts = timestamp ?? S.tick();
  const scope = grantRecord.permissionGrant.scope;
  const revocationBytes = Encoder.objectToBytes(description === undefined ? {} : { description });
  const recordsWrite = await RecordsWrite.create({
    signer           : grantor.signer,
    parentContextId  : grantRecord.id,
    protocol         : PermissionsProtocol.uri,
    protocolPath     : PermissionsProtocol.revocationPath,
    dataFormat       : 'application/json',
    data             : revocationBytes,
    tags             : tags ?? (scope.protocol !== undefined ? { protocol: scope.protocol } : undefined),
    messageTimestamp : ts,
    dateCreated      : ts,
  });
  return { message: recordsWrite.message, data: { bytes: revocationBytes }, recordId: recordsWrite.message.recordId };
}

/**
 * Builds an unsigned RecordsWrite through RecordsWrite.create, lets `mutate` change its
 * descriptor, then signs it with the reference's own `sign()` — the way to author messages
 * that create() would have normalized or refused (e.g. an unnormalized schema URL).
 */
export async function writeWithMutatedDescriptor(S, { author, data, mutate, dataFormat = 'text/plain', timestamp, ...rest }) {
  const ts = timestamp ?? S.tick();
  const recordsWrite = await RecordsWrite.create({
    ...rest,
    dataFormat,
    data             : data.bytes,
    messageTimestamp : ts,
    dateCreated      : ts,
  });
  mutate(recordsWrite._message.descriptor);
  await recordsWrite.sign({ signer: author.signer });
  return { message: recordsWrite.message, data, recordId: recordsWrite.message.recordId };
}
