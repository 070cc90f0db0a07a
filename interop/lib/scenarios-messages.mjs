// Scenarios for the Messages interface (MessagesQuery over the event log, MessagesRead by CID,
// MessagesSubscribe) and RecordsSubscribe, as the reference answers them behind the pipe (built
// without an event stream, so every schema-valid subscription is 501).

import { base32 } from 'multiformats/bases/base32';
import { base58btc } from 'multiformats/bases/base58';
import { CID } from 'multiformats/cid';
import * as Digest from 'multiformats/hashes/digest';
import { sha256, sha512 } from 'multiformats/hashes/sha2';

import {
  Cid,
  DwnInterfaceName,
  DwnMethodName,
  Encoder,
  Message,
  MessagesQuery,
  MessagesRead,
  MessagesSubscribe,
  RecordsSubscribe,
  Time,
} from '@tbd54566975/dwn-sdk-js';

import { bytes, configure, del, gen, grant, permissionRequest, revoke, update, write } from './scenario.mjs';

const BASE = 'https://p2psync.example/protocols';

const CHAT = {
  protocol  : `${BASE}/chat`,
  published : true,
  types     : { thread: {}, reply: {} },
  structure : { thread: { reply: {} } },
};

const OTHER = {
  protocol  : `${BASE}/other`,
  published : false,
  types     : { entry: {} },
  structure : { entry: {} },
};

const DAG_CBOR = 0x71;
const DAG_PB = 0x70;
const RAW = 0x55;

async function messagesQuery(S, { author, filters, cursor, permissionGrantId, timestamp }) {
  const q = await MessagesQuery.create({
    signer           : author.signer,
    filters,
    cursor,
    permissionGrantId,
    messageTimestamp : timestamp ?? S.tick(),
  });
  return q.message;
}

async function messagesRead(S, { author, messageCid, permissionGrantId, timestamp }) {
  const r = await MessagesRead.create({
    signer           : author.signer,
    messageCid,
    permissionGrantId,
    messageTimestamp : timestamp ?? S.tick(),
  });
  return r.message;
}

async function messagesSubscribe(S, { author, filters, permissionGrantId, timestamp }) {
  const s = await MessagesSubscribe.create({
    signer           : author.signer,
    filters,
    permissionGrantId,
    messageTimestamp : timestamp ?? S.tick(),
  });
  return s.message;
}

/** A message over `descriptor` (one create() would refuse or normalize), signed by `author`. */
async function signed(descriptor, author, permissionGrantId) {
  const authorization = await Message.createAuthorization({ descriptor, signer: author.signer, permissionGrantId });
  return { descriptor, authorization };
}

/** A MessagesRead of an arbitrary `messageCid` string (create() only takes valid CIDs). */
async function readOfString(S, author, messageCid) {
  const valid = await messagesRead(S, { author, messageCid: await Cid.computeCid({ placeholder: true }) });
  const descriptor = { ...valid.descriptor, messageCid };
  if (messageCid === undefined) {
    delete descriptor.messageCid;
  }
  return signed(descriptor, author);
}

function withBadSignature(message) {
  const copy = JSON.parse(JSON.stringify(message));
  const entry = copy.authorization.signature.signatures[0];
  const s = entry.signature;
  entry.signature = (s[0] === 'A' ? 'B' : 'A') + s.slice(1);
  return copy;
}

function varint(n) {
  const out = [];
  while (n >= 0x80) {
    out.push((n & 0x7f) | 0x80);
    n >>>= 7;
  }
  out.push(n);
  return out;
}

/** CID strings the reference's Cid.parseCid treats in every way it can. */
async function cidSpellings(storedCid) {
  const cid = CID.parse(storedCid);
  const digest = cid.multihash.digest;
  const someDigest = (await sha256.digest(Encoder.stringToBytes('not stored'))).digest;
  const v1 = (version, codec, multihashBytes) => Uint8Array.from([...varint(version), ...varint(codec), ...multihashBytes]);
  const mh = (code, d) => [...varint(code), ...varint(d.length), ...d];
  const nonMinimal = Uint8Array.from([0x01, 0xf1, 0x00, ...mh(0x12, digest)]);
  const canonicalText = base32.encode(cid.bytes);
  // the last base32 character carries 3 data bits and 2 zero bits; set one of the zero bits
  const lastIndex = 'abcdefghijklmnopqrstuvwxyz234567'.indexOf(canonicalText.at(-1));
  const badTail = canonicalText.slice(0, -1) + 'abcdefghijklmnopqrstuvwxyz234567'[lastIndex | 1];
  return {
    base58btc       : base58btc.encode(cid.bytes),
    padded          : `${canonicalText}======`,
    upper           : `B${canonicalText.slice(1).toUpperCase()}`,
    cidV0           : CID.createV0(Digest.create(0x12, someDigest)).toString(),
    raw             : CID.createV1(RAW, Digest.create(0x12, someDigest)).toString(),
    dagPb           : CID.createV1(DAG_PB, Digest.create(0x12, someDigest)).toString(),
    sha512          : CID.createV1(DAG_CBOR, await sha512.digest(Encoder.stringToBytes('x'))).toString(),
    shortDigest     : base32.encode(v1(1, DAG_CBOR, mh(0x12, digest.subarray(0, 4)))),
    nonMinimal32    : base32.encode(nonMinimal),
    nonMinimal58    : base58btc.encode(nonMinimal),
    version2        : base32.encode(v1(2, DAG_CBOR, mh(0x12, digest))),
    trailingByte    : base32.encode(Uint8Array.from([...cid.bytes, 0])),
    badTail,
  };
}

async function setup(S, tenant, ...definitions) {
  const out = [];
  for (const definition of definitions) {
    const c = await configure(S, { author: tenant, definition });
    await S.process(tenant, c.message, { want: 202, note: `configure ${definition.protocol}` });
    out.push(c);
  }
  return out;
}

export const scenarios = [
  {
    name        : 'messages-interface',
    description : 'MessagesQuery over the event log (filters, order, pruning of superseded messages), MessagesRead by CID (data, spellings of CIDs, 404s), grants scoped to a protocol, and subscriptions on a DWN without an event stream (501).',
    tags        : ['messages', 'event-log', 'permissions', 'subscriptions'],
    async build(S) {
      const alice = await S.persona('alice', 'key');
      const bob = await S.persona('bob', 'jwk');
      const carol = await S.persona('carol', 'key');
      const [chatConfig, otherConfig] = await setup(S, alice, CHAT, OTHER);

      // ---- the log -----------------------------------------------------------------------
      const flat = await write(S, { author: alice, data: bytes('a flat-space record') });
      await S.send(alice, flat, { want: 202, note: 'flat-space record' });
      const thread = await write(S, { author: alice, data: bytes('a thread'), protocol: CHAT.protocol, protocolPath: 'thread' });
      await S.send(alice, thread, { want: 202, note: 'chat thread' });
      const entry = await write(S, { author: alice, data: bytes('an entry'), protocol: OTHER.protocol, protocolPath: 'entry' });
      await S.send(alice, entry, { want: 202, note: 'entry of the other protocol' });
      const empty = await write(S, { author: alice, data: bytes('') });
      await S.send(alice, empty, { want: 202, note: '0-byte record' });
      const noData = await write(S, { author: alice, data: bytes('never sent') });
      await S.send(alice, noData, { withData: false, want: 204, note: 'initial write without its data (logged too)' });
      const big = await write(S, { author: alice, data: gen(40_000, 31), dataFormat: 'application/octet-stream' });
      await S.send(alice, big, { want: 202, note: '40,000-byte record (data store)' });

      const q = async (note, filters, extra = {}) => {
        const m = await messagesQuery(S, { author: alice, filters, ...extra });
        await S.query(alice, m, { want: 200, note });
        return m;
      };
      const firstQuery = await q('alice lists her whole event log, in log order');
      await q('interface Protocols', [{ interface: DwnInterfaceName.Protocols }]);
      await q('Records Write', [{ interface: DwnInterfaceName.Records, method: DwnMethodName.Write }]);
      await q('method Configure only', [{ method: DwnMethodName.Configure }]);
      await q('protocol chat (its configure and thread)', [{ protocol: CHAT.protocol }]);
      await q('chat OR other', [{ protocol: CHAT.protocol }, { protocol: OTHER.protocol }]);
      const t = (m) => m.message.descriptor.messageTimestamp;
      await q('messageTimestamp from the thread (inclusive) to the big record (exclusive)', [{ messageTimestamp: { from: t(thread), to: t(big) } }]);
      await q('messageTimestamp from the 0-byte record on', [{ messageTimestamp: { from: t(empty) } }]);
      await q('messageTimestamp before the thread', [{ messageTimestamp: { to: t(thread) } }]);
      await q('protocol chat within a time range', [{ protocol: CHAT.protocol, messageTimestamp: { from: t(flat) } }]);
      await q('no deletes yet', [{ method: DwnMethodName.Delete }]);
      await q('a string cursor sorts before every entry', undefined, { cursor: { messageCid: await Message.getCid(flat.message), value: '' } });
      await q('lowercase-protocol filter normalized by create()', [{ protocol: 'P2PSYNC.example/protocols/chat' }]);

      // ---- updates, deletes, prunes, reconfiguration --------------------------------------
      const upd = await update(S, { author: alice, from: thread.message, data: bytes('thread, edited') });
      await S.send(alice, upd, { want: 202, note: 'thread updated' });
      const upd2 = await update(S, { author: alice, from: upd.message, data: bytes('thread, edited twice') });
      await S.send(alice, upd2, { want: 202, note: 'updated again: the first update leaves the log' });
      await q('log after updates: initial write kept, superseded update gone');
      const delFlat = await del(S, { author: alice, recordId: flat.recordId });
      await S.process(alice, delFlat.message, { want: 202, note: 'flat record deleted' });
      await q('deletes only', [{ method: DwnMethodName.Delete }]);
      const reply = await write(S, { author: alice, data: bytes('a reply'), protocol: CHAT.protocol, protocolPath: 'thread/reply', parentContextId: thread.contextId });
      await S.send(alice, reply, { want: 202, note: 'reply in the thread' });
      await q('chat before pruning', [{ protocol: CHAT.protocol }]);
      const prune = await del(S, { author: alice, recordId: thread.recordId, prune: true });
      await S.process(alice, prune.message, { want: 202, note: 'thread deleted with prune: its reply leaves the log' });
      await q('chat after pruning', [{ protocol: CHAT.protocol }]);
      const chatConfig2 = await configure(S, { author: alice, definition: { ...CHAT, types: { thread: {}, reply: {}, note: {} } } });
      await S.process(alice, chatConfig2.message, { want: 202, note: 'chat reconfigured: the old configure leaves the log' });
      await q('protocol configurations', [{ interface: DwnInterfaceName.Protocols }]);
      await q('the whole log now');

      // ---- MessagesRead by the owner ------------------------------------------------------
      const r = async (note, messageCid, want) => {
        const m = await messagesRead(S, { author: alice, messageCid });
        await S.process(alice, m, { want, note });
      };
      const cidOf = (m) => Message.getCid(m.message ?? m);
      await r('read the entry: message and data', await cidOf(entry), 200);
      await r('read the 0-byte record by its logged CID: stored under another one', await cidOf(empty), 404);
      await r('read the 0-byte record by its stored CID (with encodedData "")', await Cid.computeCid({ ...empty.message, encodedData: '' }), 200);
      await r('read the write stored without data: no data', await cidOf(noData), 200);
      await r('read the 40,000-byte record: data from the data store', await cidOf(big), 200);
      await r('read the thread\'s initial write: kept, without data', await cidOf(thread), 200);
      await r('read a superseded update', await cidOf(upd), 404);
      await r('read the pruned reply', await cidOf(reply), 404);
      await r('read the pruning delete', await cidOf(prune), 200);
      await r('read the flat record\'s delete', await cidOf(delFlat), 200);
      await r('read the current chat configuration', await cidOf(chatConfig2), 200);
      await r('read the replaced chat configuration', await cidOf(chatConfig), 404);
      await r('read a MessagesQuery (never stored)', await cidOf(firstQuery), 404);

      const spell = await cidSpellings(await cidOf(entry));
      const rs = async (note, messageCid, want) => {
        await S.process(alice, await readOfString(S, alice, messageCid), { want, note });
      };
      await rs('entry CID spelled in base58btc: found', spell.base58btc, 200);
      await rs('entry CID with "=" padding: parses, looked up verbatim, not found', spell.padded, 404);
      await rs('entry CID in uppercase base32 (multibase B)', spell.upper, 400);
      await rs('a CIDv0', spell.cidV0, 400);
      await rs('a raw-codec CIDv1', spell.raw, 400);
      await rs('a dag-pb CIDv1', spell.dagPb, 400);
      await rs('a dag-cbor CID with sha2-512', spell.sha512, 400);
      await rs('a sha2-256 CID with a 4-byte digest: parses, not found', spell.shortDigest, 404);
      await rs('entry CID with a non-minimal codec varint, base32: not found', spell.nonMinimal32, 404);
      await rs('the same in base58btc: canonicalized, found', spell.nonMinimal58, 200);
      await rs('CID version 2', spell.version2, 400);
      await rs('entry CID with a trailing byte', spell.trailingByte, 400);
      await rs('entry CID with non-zero padding bits', spell.badTail, 400);
      await rs('not a CID', 'hello', 400);
      await rs('empty string', '', 400);
      await rs('no messageCid at all', undefined, 400);

      const okRead = await messagesRead(S, { author: alice, messageCid: await cidOf(entry) });
      await S.process(alice, withBadSignature(okRead), { want: 401, note: 'MessagesRead with a broken signature' });
      const badDay = await signed({ ...okRead.descriptor, messageTimestamp: '2024-02-30T00:00:00.000000Z' }, alice);
      await S.process(alice, badDay, { want: 400, note: 'MessagesRead stamped on 30 February' });
      const badDayQuery = await signed({ ...firstQuery.descriptor, messageTimestamp: '2024-02-30T00:00:00.000000Z' }, alice);
      await S.query(alice, badDayQuery, { want: 200, note: 'MessagesQuery stamped on 30 February: its parse checks no timestamp' });
      const unnormalized = await signed({ ...firstQuery.descriptor, filters: [{ protocol: 'p2psync.example/protocols/chat' }] }, alice);
      await S.query(alice, unnormalized, { want: 400, note: 'MessagesQuery with an unnormalized protocol filter' });
      const emptyFilter = await signed({ ...firstQuery.descriptor, filters: [{}] }, alice);
      await S.query(alice, emptyFilter, { want: 400, note: 'an empty filter object' });
      const messagesFilter = await signed({ ...firstQuery.descriptor, filters: [{ interface: 'Messages' }] }, alice);
      await S.query(alice, messagesFilter, { want: 400, note: 'filter on the Messages interface' });
      const noFilters = { ...firstQuery.descriptor };
      delete noFilters.filters;
      await S.query(alice, await signed(noFilters, alice), { want: 400, note: 'no filters property' });
      await S.query(alice, withBadSignature(firstQuery), { want: 401, note: 'MessagesQuery with a broken signature' });
      const drifted = { ...firstQuery, descriptor: { ...firstQuery.descriptor, filters: [{ method: 'Write' }] } };
      await S.query(alice, drifted, { want: 400, note: 'descriptor changed after signing' });

      // ---- others, and grants --------------------------------------------------------------
      await S.query(alice, await messagesQuery(S, { author: bob }), { want: 401, note: 'bob queries alice\'s log without a grant' });
      await S.process(alice, await messagesRead(S, { author: bob, messageCid: await cidOf(thread) }), { want: 401, note: 'bob reads a message without a grant' });
      await S.process(alice, await messagesRead(S, { author: bob, messageCid: await cidOf(firstQuery) }), { want: 404, note: 'bob reads an unknown CID: 404 comes before authorization' });
      await S.query(bob, await messagesQuery(S, { author: bob }), { want: 200, note: 'bob queries his own empty log' });
      await S.query(bob, await messagesQuery(S, { author: alice }), { want: 401, note: 'alice queries bob\'s log' });

      const request = await permissionRequest(S, { requester: bob, scope: { interface: DwnInterfaceName.Messages, method: DwnMethodName.Query, protocol: CHAT.protocol } });
      await S.send(alice, request, { want: 202, note: 'bob requests Messages.Query on chat (a permission record tagged chat)' });
      const qGrant = await grant(S, { grantor: alice, grantee: bob, scope: { interface: DwnInterfaceName.Messages, method: DwnMethodName.Query, protocol: CHAT.protocol }, seconds: 600 });
      await S.send(alice, qGrant, { want: 202, note: 'alice grants bob Messages.Query on chat' });
      const bq = async (note, filters, want, extra = {}) => {
        const m = await messagesQuery(S, { author: bob, filters, permissionGrantId: qGrant.id, ...extra });
        await S.query(alice, m, { want, note });
      };
      await bq('bob queries chat with it: chat messages and permission records about chat', [{ protocol: CHAT.protocol }], 200);
      await bq('chat OR other: every filter must name chat', [{ protocol: CHAT.protocol }, { protocol: OTHER.protocol }], 401);
      await bq('a filter without a protocol', [{ interface: DwnInterfaceName.Records }], 401);
      await bq('no filters at all: nothing to check, the whole log', undefined, 200);
      await bq('stamped after the grant expired', [{ protocol: CHAT.protocol }], 401, { timestamp: Time.createOffsetTimestamp({ seconds: 600 }, qGrant.message.descriptor.messageTimestamp) });
      await bq('stamped before the grant was issued', [{ protocol: CHAT.protocol }], 401, { timestamp: S.at(-3600) });
      const carolWithBobsGrant = await messagesQuery(S, { author: carol, filters: [{ protocol: CHAT.protocol }], permissionGrantId: qGrant.id });
      await S.query(alice, carolWithBobsGrant, { want: 401, note: 'carol invokes bob\'s grant' });
      await S.process(alice, await messagesRead(S, { author: bob, messageCid: await cidOf(prune), permissionGrantId: qGrant.id }), { want: 401, note: 'a Query grant used to read' });
      await S.process(alice, await messagesSubscribe(S, { author: bob, permissionGrantId: qGrant.id }), { want: 501, note: 'a Query grant used to subscribe: 501 before anything else' });

      const anyGrant = await grant(S, { grantor: alice, grantee: bob, scope: { interface: DwnInterfaceName.Messages, method: DwnMethodName.Query } });
      await S.send(alice, anyGrant, { want: 202, note: 'an unscoped Messages.Query grant' });
      await S.query(alice, await messagesQuery(S, { author: bob, filters: [{ protocol: OTHER.protocol }], permissionGrantId: anyGrant.id }), { want: 200, note: 'bob queries the other protocol with it' });

      const rGrant = await grant(S, { grantor: alice, grantee: bob, scope: { interface: DwnInterfaceName.Messages, method: DwnMethodName.Read, protocol: CHAT.protocol } });
      await S.send(alice, rGrant, { want: 202, note: 'alice grants bob Messages.Read on chat' });
      const signedBeforeRevocation = await messagesRead(S, { author: bob, messageCid: await cidOf(thread), permissionGrantId: rGrant.id });
      const br = async (note, messageCid, want) => {
        const m = await messagesRead(S, { author: bob, messageCid, permissionGrantId: rGrant.id });
        await S.process(alice, m, { want, note });
      };
      await br('bob reads the chat thread\'s initial write', await cidOf(thread), 200);
      await br('the pruning delete of it (judged by the newest write)', await cidOf(prune), 200);
      await br('the chat configuration', await cidOf(chatConfig2), 200);
      await br('the other protocol\'s configuration', await cidOf(otherConfig), 401);
      await br('the other protocol\'s entry', await cidOf(entry), 401);
      await br('the flat record', await cidOf(big), 401);
      await br('the flat record\'s delete', await cidOf(delFlat), 401);
      await br('the Messages.Query grant on chat (a permission record about chat)', await cidOf(qGrant), 200);
      await br('bob\'s request about chat', await cidOf(request), 200);
      await br('the unscoped grant', await cidOf(anyGrant), 401);
      await br('an unknown CID', await cidOf(firstQuery), 404);
      const revocation = await revoke(S, { grantor: alice, grantRecord: rGrant });
      await S.send(alice, revocation, { want: 202, note: 'alice revokes the read grant' });
      await S.process(alice, signedBeforeRevocation, { want: 200, note: 'a read signed before the revocation, processed after it' });
      await br('a read signed after the revocation', await cidOf(thread), 401);
      await S.process(alice, await messagesRead(S, { author: alice, messageCid: await cidOf(revocation) }), { want: 200, note: 'alice reads the revocation' });
      await q('permission records about chat show up under a chat filter', [{ protocol: CHAT.protocol }]);

      // ---- subscriptions: the harness's DWN has no event stream --------------------------
      const sub = await messagesSubscribe(S, { author: alice, filters: [{ protocol: CHAT.protocol }] });
      await S.process(alice, sub, { want: 501, note: 'alice subscribes to her log' });
      await S.process(alice, await messagesSubscribe(S, { author: bob }), { want: 501, note: 'bob subscribes without a grant' });
      await S.process(alice, withBadSignature(sub), { want: 501, note: 'a broken signature' });
      await S.process(alice, await signed({ ...sub.descriptor, messageTimestamp: '2024-03-01, not a timestamp' }, alice), { want: 501, note: 'its schema leaves messageTimestamp a bare string' });
      await S.process(alice, await signed({ ...sub.descriptor, filters: [{}] }, alice), { want: 400, note: 'an empty filter object fails the schema first' });
      const unsigned = { descriptor: sub.descriptor };
      await S.process(alice, unsigned, { want: 400, note: 'MessagesSubscribe must be signed' });
      const recSub = await RecordsSubscribe.create({ signer: alice.signer, filter: { protocol: CHAT.protocol }, messageTimestamp: S.tick() });
      await S.process(alice, recSub.message, { want: 501, note: 'RecordsSubscribe by the owner' });
      const anonSub = await RecordsSubscribe.create({ filter: { schema: 'https://example.com/note' }, messageTimestamp: S.tick() });
      await S.process(alice, anonSub.message, { want: 501, note: 'anonymous RecordsSubscribe' });
      await S.process(alice, { descriptor: { ...anonSub.message.descriptor, filter: {} } }, { want: 400, note: 'RecordsSubscribe with an empty filter' });
      await S.process(alice, { descriptor: { ...anonSub.message.descriptor, extra: 1 } }, { want: 400, note: 'RecordsSubscribe with an unknown descriptor property' });
    },
  },
];
