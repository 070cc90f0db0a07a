// Scenarios for flat-space records (no protocol): writes, data handling, updates, deletes,
// reads, queries, message integrity. Each `build(S)` authors messages with the reference's
// classes (through lib/scenario.mjs) and states the code it expects at each step.

import { Cid, DateSort, Encoder, Message, RecordsQuery, RecordsWrite, Time } from '@tbd54566975/dwn-sdk-js';

import { bytes, del, gen, json, query, read, update, write, writeWithMutatedDescriptor } from './scenario.mjs';

const KIB = 1024;
// Thresholds of the reference (DwnConstant.maxDataSizeAllowedToBeEncoded, and the size up
// to which a dataCid is a single raw block) and one byte either side of them.
const INLINE_MAX = 30_000;
const SINGLE_BLOCK_MAX = 262_144;

function clone(obj) {
  return JSON.parse(JSON.stringify(obj));
}

async function seedRecords(S, alice) {
  // one record, used by the integrity scenarios
  return write(S, { author: alice, data: bytes('hello p2psync'), schema: 'https://example.com/note' });
}

export const scenarios = [
  {
    name        : 'records-write-data-sizes',
    description : 'Initial writes with data of 0, 1, 30,000, 30,001, 262,144, 262,145 bytes and 1 MiB, each read back by the owner.',
    tags        : ['records', 'data'],
    async build(S) {
      const alice = await S.persona('alice', 'key');
      const sizes = [0, 1, 1000, INLINE_MAX, INLINE_MAX + 1, SINGLE_BLOCK_MAX, SINGLE_BLOCK_MAX + 1, KIB * KIB];
      let seed = 1;
      for (const size of sizes) {
        const data = size <= 1000 ? bytes(gen(size, seed).bytes) : gen(size, seed);
        seed++;
        const w = await write(S, { author: alice, data, dataFormat: 'application/octet-stream' });
        await S.send(alice, w, { want: 202, note: `initial write with ${size} bytes of data` });
        const r = await read(S, { author: alice, filter: { recordId: w.recordId } });
        await S.process(alice, r.message, { want: 200, note: `owner reads the ${size}-byte record back` });
      }
      const q = await query(S, { author: alice, filter: { dataFormat: 'application/octet-stream' } });
      await S.query(alice, q.message, { want: 200, note: 'owner lists all of them (dateCreated ascending)' });
      const big = await query(S, { author: alice, filter: { dataSize: { gt: INLINE_MAX } } });
      await S.query(alice, big.message, { want: 200, note: 'dataSize > 30,000: the ones kept in the data store' });
    },
  },

  {
    name        : 'records-write-without-data',
    description : 'An initial write without data is stored (204) but neither readable nor queryable; its data can only come with a newer write.',
    tags        : ['records', 'data'],
    async build(S) {
      const alice = await S.persona('alice', 'key');
      const w = await write(S, { author: alice, data: bytes('data arrives later') });
      await S.send(alice, w, { withData: false, want: 204, note: 'initial write without data: stored, not queryable' });
      await S.send(alice, w, { withData: false, want: 409, note: 'the same message again without data' });
      await S.send(alice, w, { want: 409, note: 'the same message with its data: still a duplicate' });
      const r = await read(S, { author: alice, filter: { recordId: w.recordId } });
      await S.process(alice, r.message, { want: 404, note: 'read finds no readable state' });
      const q = await query(S, { author: alice, filter: { recordId: w.recordId } });
      await S.query(alice, q.message, { want: 200, note: 'query returns nothing for it' });
      const u0 = await update(S, { author: alice, from: w.message });
      await S.send(alice, u0, { withData: false, want: 400, note: 'update without data: nothing to take the data from' });
      const u1 = await update(S, { author: alice, from: w.message, data: bytes('data arrives later') });
      await S.send(alice, u1, { want: 202, note: 'newer write carrying the data' });
      const r2 = await read(S, { author: alice, filter: { recordId: w.recordId } });
      await S.process(alice, r2.message, { want: 200, note: 'now readable' });
      await S.query(alice, (await query(S, { author: alice, filter: { recordId: w.recordId } })).message, { want: 200, note: 'and queryable, with its initial write attached' });

      // the same with data that lives in the data store
      const big = await write(S, { author: alice, data: gen(INLINE_MAX + 500, 77) });
      await S.send(alice, big, { withData: false, want: 204, note: 'large initial write without data' });
      const bigU = await update(S, { author: alice, from: big.message });
      await S.send(alice, bigU, { withData: false, want: 400, note: 'large update without data: data store has nothing' });
      const bigU2 = await update(S, { author: alice, from: big.message, data: gen(INLINE_MAX + 500, 77) });
      await S.send(alice, bigU2, { want: 202, note: 'large newer write with the data' });
      const r3 = await read(S, { author: alice, filter: { recordId: big.recordId } });
      await S.process(alice, r3.message, { want: 200, note: 'large record readable' });
    },
  },

  {
    name        : 'records-updates',
    description : 'Newer writes replace older ones; older writes and replays are 409; updates without data keep the data; equal timestamps are ordered by message CID.',
    tags        : ['records', 'updates'],
    async build(S) {
      const alice = await S.persona('alice', 'key');
      const w = await write(S, { author: alice, data: bytes('v1'), schema: 'https://example.com/doc' });
      await S.send(alice, w, { want: 202, note: 'initial write v1' });
      const tOld = S.tick();
      const u2 = await update(S, { author: alice, from: w.message, data: bytes('v2') });
      const uOlder = await update(S, { author: alice, from: w.message, data: bytes('v-older'), timestamp: tOld });
      await S.send(alice, u2, { want: 202, note: 'update v2' });
      await S.send(alice, uOlder, { want: 409, note: 'update older than v2 (but newer than v1)' });
      await S.send(alice, u2, { want: 409, note: 'replay of v2' });
      await S.send(alice, w, { want: 409, note: 'replay of the initial write' });
      const r = await read(S, { author: alice, filter: { recordId: w.recordId } });
      await S.process(alice, r.message, { want: 200, note: 'read returns v2' });

      const u3 = await update(S, { author: alice, from: u2.message, published: true });
      await S.send(alice, u3, { withData: false, want: 202, note: 'update without data (publishes): data of v2 kept' });
      const r2 = await read(S, { author: alice, filter: { recordId: w.recordId } });
      await S.process(alice, r2.message, { want: 200, note: 'read still returns v2 data' });
      const anon = await read(S, { filter: { recordId: w.recordId } });
      await S.process(alice, anon.message, { want: 200, note: 'anonymous read of the now published record' });

      const u4 = await update(S, { author: alice, from: u3.message, data: bytes('v4'), dataFormat: 'application/json' });
      await S.send(alice, u4, { want: 202, note: 'update changing dataFormat (mutable)' });
      const u5 = await update(S, { author: alice, from: u4.message, data: bytes('v5') });
      await S.send(alice, u5, { withData: false, want: 400, note: 'update claiming new data but sending none (dataCid differs from the newest)' });
      const q = await query(S, { author: alice, filter: { schema: 'https://example.com/doc' } });
      await S.query(alice, q.message, { want: 200, note: 'query: one entry, the newest write, with initialWrite' });

      // equal messageTimestamp: the larger message CID wins
      const tie = S.tick();
      const a = await update(S, { author: alice, from: u4.message, data: bytes('tie-a'), timestamp: tie });
      const b = await update(S, { author: alice, from: u4.message, data: bytes('tie-b'), timestamp: tie });
      const [small, large] = (await Message.getCid(a.message)) < (await Message.getCid(b.message)) ? [a, b] : [b, a];
      await S.send(alice, small, { want: 202, note: 'same timestamp, smaller CID first: accepted' });
      await S.send(alice, large, { want: 202, note: 'same timestamp, larger CID: newer, accepted' });
      await S.send(alice, small, { want: 409, note: 'same timestamp, smaller CID again: older' });
      const r3 = await read(S, { author: alice, filter: { recordId: w.recordId } });
      await S.process(alice, r3.message, { want: 200, note: 'read returns the larger-CID write' });
    },
  },

  {
    name        : 'records-update-immutable-and-author',
    description : 'Updates must keep immutable properties, and only the tenant may update a flat-space record.',
    tags        : ['records', 'updates'],
    async build(S) {
      const alice = await S.persona('alice', 'key');
      const bob = await S.persona('bob', 'jwk');
      const w = await write(S, { author: alice, data: bytes('original'), schema: 'https://example.com/a', recipient: bob.did });
      await S.send(alice, w, { want: 202, note: 'initial write (recipient bob)' });
      const base = {
        recordId    : w.recordId,
        dateCreated : w.message.descriptor.dateCreated,
        data        : bytes('changed'),
        author      : alice,
      };
      const schemaChanged = await write(S, { ...base, schema: 'https://example.com/b', recipient: bob.did });
      await S.send(alice, schemaChanged, { want: 400, note: 'update changing schema' });
      const recipientChanged = await write(S, { ...base, schema: 'https://example.com/a' });
      await S.send(alice, recipientChanged, { want: 400, note: 'update dropping the recipient' });
      const dateChanged = await write(S, { ...base, schema: 'https://example.com/a', recipient: bob.did, dateCreated: S.at(-1) });
      await S.send(alice, dateChanged, { want: 400, note: 'update changing dateCreated' });
      const ok = await write(S, { ...base, schema: 'https://example.com/a', recipient: bob.did });
      await S.send(alice, ok, { want: 202, note: 'update keeping every immutable property' });
      const byBob = await update(S, { author: bob, from: ok.message, data: bytes('bob was here') });
      await S.send(alice, byBob, { want: 401, note: 'recipient bob updates a flat-space record of alice' });
      const bobRead = await read(S, { author: bob, filter: { recordId: w.recordId } });
      await S.process(alice, bobRead.message, { want: 200, note: 'recipient bob may read it' });
      const unknownRecord = await write(S, { author: alice, recordId: 'bafyreigbtj4x7ip5legnfznufuopl4sg4knzc2cof6duas4b3q2fy6swua', data: bytes('x'), dateCreated: S.at(-5) });
      await S.send(alice, unknownRecord, { want: 400, note: 'non-initial write for a record that does not exist' });
    },
  },

  {
    name        : 'records-data-mismatch',
    description : 'Data that does not match dataCid or dataSize is refused (400), inline and in the data store; a correct write of the same record afterwards succeeds.',
    tags        : ['records', 'data'],
    async build(S) {
      const alice = await S.persona('alice', 'jwk');
      for (const [label, good, other] of [
        ['small', bytes('the real data'), bytes('some other data')],
        ['large', gen(INLINE_MAX + 1000, 5), gen(INLINE_MAX + 1000, 6)],
        ['multi-block', gen(SINGLE_BLOCK_MAX + 10, 8), gen(SINGLE_BLOCK_MAX + 10, 9)],
      ]) {
        const realCid = await Cid.computeDagPbCidFromBytes(good.bytes);
        const otherCid = await Cid.computeDagPbCidFromBytes(other.bytes);
        const wrongCid = await write(S, { author: alice, dataCid: otherCid, dataSize: good.bytes.length });
        await S.send(alice, wrongCid, { data: good, want: 400, note: `${label}: dataCid of other bytes` });
        const wrongSize = await write(S, { author: alice, dataCid: realCid, dataSize: good.bytes.length + 1 });
        await S.send(alice, wrongSize, { data: good, want: 400, note: `${label}: dataSize one too large` });
        const rightMsgWrongData = await write(S, { author: alice, data: good });
        await S.send(alice, rightMsgWrongData, { data: other, want: 400, note: `${label}: message right, other bytes sent` });
        await S.send(alice, rightMsgWrongData, { want: 202, note: `${label}: the same message with its own data` });
        const r = await read(S, { author: alice, filter: { recordId: rightMsgWrongData.recordId } });
        await S.process(alice, r.message, { want: 200, note: `${label}: reads back the right data` });
      }
      const shortData = await write(S, { author: alice, data: bytes('0123456789') });
      await S.send(alice, shortData, { data: bytes('01234'), want: 400, note: 'truncated data' });
      const empty = await write(S, { author: alice, data: bytes('') });
      await S.send(alice, empty, { data: bytes('x'), want: 400, note: 'message for 0 bytes, one byte sent' });
      await S.send(alice, empty, { want: 202, note: 'message for 0 bytes, 0 bytes sent' });
    },
  },

  {
    name        : 'records-delete',
    description : 'Deletes: accepted once, 404 on replay or missing record, 409 when older than the newest write; writes after a delete are 400 (newer) or 409 (older).',
    tags        : ['records', 'delete'],
    async build(S) {
      const alice = await S.persona('alice', 'key');
      const bob = await S.persona('bob', 'key');
      const w = await write(S, { author: alice, data: bytes('to be deleted'), schema: 'https://example.com/t' });
      await S.send(alice, w, { want: 202, note: 'initial write' });
      const tBetween = S.tick();
      const u = await update(S, { author: alice, from: w.message, data: bytes('updated') });
      await S.send(alice, u, { want: 202, note: 'update' });
      const oldDelete = await del(S, { author: alice, recordId: w.recordId, timestamp: tBetween });
      await S.process(alice, oldDelete.message, { want: 409, note: 'delete older than the newest write' });
      const bobDelete = await del(S, { author: bob, recordId: w.recordId });
      await S.process(alice, bobDelete.message, { want: 401, note: 'non-owner deletes a flat-space record' });
      const d = await del(S, { author: alice, recordId: w.recordId });
      await S.process(alice, d.message, { want: 202, note: 'owner deletes' });
      await S.process(alice, d.message, { want: 404, note: 'replay of the delete' });
      const d2 = await del(S, { author: alice, recordId: w.recordId });
      await S.process(alice, d2.message, { want: 404, note: 'newer delete of a deleted record' });
      const r = await read(S, { author: alice, filter: { recordId: w.recordId } });
      await S.process(alice, r.message, { want: 404, note: 'read of a deleted record' });
      const q = await query(S, { author: alice, filter: { schema: 'https://example.com/t' } });
      await S.query(alice, q.message, { want: 200, note: 'query no longer lists it' });
      const after = await update(S, { author: alice, from: u.message, data: bytes('after delete') });
      await S.send(alice, after, { want: 400, note: 'newer write after the delete' });
      const before = await update(S, { author: alice, from: w.message, data: bytes('before delete'), timestamp: S.at(-8) });
      await S.send(alice, before, { want: 409, note: 'write older than the delete' });
      await S.send(alice, w, { want: 409, note: 'replay of the initial write after delete' });
      const missing = await del(S, { author: alice, recordId: 'bafyreigbtj4x7ip5legnfznufuopl4sg4knzc2cof6duas4b3q2fy6swua' });
      await S.process(alice, missing.message, { want: 404, note: 'delete of a record that never existed' });

      const noData = await write(S, { author: alice, data: bytes('never sent') });
      await S.send(alice, noData, { withData: false, want: 204, note: 'initial write without data' });
      const dNoData = await del(S, { author: alice, recordId: noData.recordId });
      await S.process(alice, dNoData.message, { want: 202, note: 'delete of a record whose data never arrived' });

      const big = await write(S, { author: alice, data: gen(INLINE_MAX + 10, 3) });
      await S.send(alice, big, { want: 202, note: 'large record' });
      const dBig = await del(S, { author: alice, recordId: big.recordId });
      await S.process(alice, dBig.message, { want: 202, note: 'delete of the large record' });
      const rBig = await read(S, { author: alice, filter: { recordId: big.recordId } });
      await S.process(alice, rBig.message, { want: 404, note: 'large record gone' });
    },
  },

  {
    name        : 'records-read-access',
    description : 'Who may read a flat-space record: owner, anyone when published, the recipient; others get 401; missing records 404; ambiguous filters 400.',
    tags        : ['records', 'read', 'authorization'],
    async build(S) {
      const alice = await S.persona('alice', 'key');
      const bob = await S.persona('bob', 'jwk');
      const carol = await S.persona('carol', 'key');
      const priv = await write(S, { author: alice, data: bytes('private'), schema: 'https://example.com/r' });
      const pub = await write(S, { author: alice, data: bytes('public'), schema: 'https://example.com/r', published: true });
      const forBob = await write(S, { author: alice, data: bytes('for bob'), schema: 'https://example.com/r', recipient: bob.did });
      await S.send(alice, priv, { want: 202, note: 'unpublished record' });
      await S.send(alice, pub, { want: 202, note: 'published record' });
      await S.send(alice, forBob, { want: 202, note: 'unpublished record for recipient bob' });
      for (const [who, label] of [[alice, 'owner'], [bob, 'bob'], [carol, 'carol'], [undefined, 'anonymous']]) {
        for (const [rec, name] of [[priv, 'private'], [pub, 'published'], [forBob, 'for-bob']]) {
          let want = 401;
          if (who === alice || name === 'published' || (who === bob && name === 'for-bob')) {
            want = 200;
          }
          const r = await read(S, { author: who, filter: { recordId: rec.recordId } });
          await S.process(alice, r.message, { want, note: `${label} reads the ${name} record` });
        }
      }
      const missing = await read(S, { author: alice, filter: { recordId: 'bafyreigbtj4x7ip5legnfznufuopl4sg4knzc2cof6duas4b3q2fy6swua' } });
      await S.process(alice, missing.message, { want: 404, note: 'read of a missing record' });
      const ambiguous = await read(S, { author: alice, filter: { schema: 'https://example.com/r' } });
      await S.process(alice, ambiguous.message, { want: 400, note: 'read filter matching several records' });
      const single = await read(S, { author: alice, filter: { recipient: bob.did } });
      await S.process(alice, single.message, { want: 200, note: 'read by a filter matching exactly one record' });
      const otherTenant = await read(S, { author: alice, filter: { recordId: priv.recordId } });
      await S.process(bob, otherTenant.message, { want: 404, note: 'the record is not in another tenant' });
    },
  },

  {
    name        : 'records-query-filters',
    description : 'Owner queries with every flat-space filter (schema, recipient, author, dataFormat, published, dataSize, dataCid, recordId, date ranges) and the four sorts.',
    tags        : ['records', 'query'],
    async build(S) {
      const alice = await S.persona('alice', 'key');
      const bob = await S.persona('bob', 'jwk');
      const carol = await S.persona('carol', 'key');
      const records = [];
      const specs = [
        { schema: 'https://example.com/post', dataFormat: 'text/plain', published: true },
        { schema: 'https://example.com/post', dataFormat: 'text/markdown' },
        { schema: 'https://example.com/post', dataFormat: 'text/plain', recipient: bob.did },
        { schema: 'https://example.com/photo', dataFormat: 'image/png', published: true, size: 40_000 },
        { schema: 'https://example.com/photo', dataFormat: 'image/png', recipient: carol.did },
        { schema: 'https://example.com/note', dataFormat: 'text/plain', published: true },
        { schema: 'https://example.com/note', dataFormat: 'application/json', recipient: bob.did, published: true },
        { dataFormat: 'application/octet-stream' },
      ];
      let i = 0;
      const firstCreated = S.at(1);
      for (const spec of specs) {
        i++;
        const { size, ...rest } = spec;
        const data = size === undefined ? bytes(`record ${i}`) : gen(size, 100 + i);
        // published records get datePublished in reverse order of creation, to tell the sorts apart
        const datePublished = rest.published ? S.at(100 - i) : undefined;
        const w = await write(S, { author: alice, data, ...rest, datePublished });
        await S.send(alice, w, { want: 202, note: `record ${i}: ${JSON.stringify(rest)}` });
        records.push(w);
      }
      const lastCreated = S.at(0);
      const q = async (filter, note, extra = {}) => {
        const m = await query(S, { author: alice, filter, ...extra });
        await S.query(alice, m.message, { want: 200, note });
      };
      await q({ schema: 'https://example.com/post' }, 'schema filter');
      await q({ schema: 'https://example.com/missing' }, 'schema with no records');
      await q({ recipient: bob.did }, 'recipient filter');
      await q({ recipient: [bob.did, carol.did] }, 'recipient one-of filter');
      await q({ author: alice.did }, 'author filter');
      await q({ author: bob.did }, 'author filter with no records');
      await q({ dataFormat: 'text/plain' }, 'dataFormat filter');
      await q({ published: true }, 'published: true');
      await q({ published: false }, 'published: false');
      await q({ schema: 'https://example.com/post', published: false, recipient: bob.did }, 'combined filters');
      await q({ dataSize: { gte: 1000 } }, 'dataSize range');
      await q({ dataSize: { lt: 9 } }, 'dataSize below 9');
      await q({ dataCid: records[0].message.descriptor.dataCid }, 'dataCid filter');
      await q({ recordId: records[2].recordId }, 'recordId filter');
      await q({ dateCreated: { from: records[2].message.descriptor.dateCreated } }, 'dateCreated from (inclusive)');
      await q({ dateCreated: { to: records[2].message.descriptor.dateCreated } }, 'dateCreated to (exclusive)');
      await q({ dateCreated: { from: firstCreated, to: lastCreated } }, 'dateCreated from..to');
      await q({ datePublished: { from: S.at(100 - 6) } }, 'datePublished from');
      await q({ dateUpdated: { from: records[5].message.descriptor.messageTimestamp } }, 'dateUpdated from');
      await q({ author: alice.did }, 'every record of the author', {});
      await q({ dataFormat: 'text/plain' }, 'createdDescending', { dateSort: DateSort.CreatedDescending });
      await q({ dataFormat: 'text/plain' }, 'createdAscending', { dateSort: DateSort.CreatedAscending });
      await q({ published: true }, 'publishedAscending', { dateSort: DateSort.PublishedAscending });
      await q({ published: true }, 'publishedDescending', { dateSort: DateSort.PublishedDescending });
      await q({ author: alice.did }, 'publishedAscending without a published filter', { dateSort: DateSort.PublishedAscending });
      const bad = await writeQueryWithPublishedSortOnUnpublished(S, alice);
      await S.query(alice, bad, { want: 400, note: 'published:false with a published sort is invalid' });
    },
  },

  {
    name        : 'records-query-pagination',
    description : 'Pagination with limits and cursors in both directions, including records created at the same instant (ties broken by CID).',
    tags        : ['records', 'query'],
    async build(S) {
      const alice = await S.persona('alice', 'jwk');
      let ts;
      for (let i = 0; i < 9; i++) {
        // three groups of three records sharing dateCreated: ties are ordered by message CID
        if (i % 3 === 0) {
          ts = S.tick();
        }
        const w = await write(S, { author: alice, data: bytes(`page item ${i}`), schema: 'https://example.com/item', timestamp: ts });
        await S.send(alice, w, { want: 202, note: `item ${i} (dateCreated ${ts})` });
      }
      for (const dateSort of [DateSort.CreatedAscending, DateSort.CreatedDescending]) {
        let cursor;
        for (let page = 1; page <= 4; page++) {
          const m = await query(S, { author: alice, filter: { schema: 'https://example.com/item' }, dateSort, pagination: { limit: 4, cursor } });
          const { raw } = await S.query(alice, m.message, { want: 200, note: `${dateSort} page ${page} (limit 4)` });
          cursor = raw.cursor;
          if (cursor === undefined) {
            break;
          }
        }
      }
      const all = await query(S, { author: alice, filter: { schema: 'https://example.com/item' }, pagination: { limit: 100 } });
      await S.query(alice, all.message, { want: 200, note: 'limit larger than the result' });
      const zero = await query(S, { author: alice, filter: { schema: 'https://example.com/item' }, pagination: { limit: 1 } });
      await S.query(alice, zero.message, { want: 200, note: 'limit 1' });
    },
  },

  {
    name        : 'records-query-non-owner',
    description : 'A non-owner query returns only published records and unpublished ones where the querier is recipient; anonymous queries see published only.',
    tags        : ['records', 'query', 'authorization'],
    async build(S) {
      const alice = await S.persona('alice', 'key');
      const bob = await S.persona('bob', 'jwk');
      const carol = await S.persona('carol', 'key');
      const specs = [
        { label: 'published', published: true },
        { label: 'private' },
        { label: 'for bob', recipient: bob.did },
        { label: 'for carol', recipient: carol.did },
        { label: 'published for carol', recipient: carol.did, published: true },
      ];
      for (const { label, ...rest } of specs) {
        const w = await write(S, { author: alice, data: bytes(label), schema: 'https://example.com/mixed', ...rest });
        await S.send(alice, w, { want: 202, note: label });
      }
      const filter = { schema: 'https://example.com/mixed' };
      for (const [who, label] of [[alice, 'owner'], [bob, 'bob'], [carol, 'carol'], [undefined, 'anonymous']]) {
        const m = await query(S, { author: who, filter });
        await S.query(alice, m.message, { want: 200, note: `${label} queries everything` });
      }
      for (const published of [true, false]) {
        const m = await query(S, { author: bob, filter: { ...filter, published } });
        await S.query(alice, m.message, { want: 200, note: `bob queries published:${published}` });
      }
      const m = await query(S, { author: bob, filter: { ...filter, recipient: carol.did } });
      await S.query(alice, m.message, { want: 200, note: 'bob asks for carol\'s records: only the published one' });
      const anonUnpub = await query(S, { filter: { ...filter, published: false } });
      await S.query(alice, anonUnpub.message, { want: 401, note: 'anonymous query for unpublished records needs authentication' });
    },
  },

  {
    name        : 'records-signature-tampering',
    description : 'Messages whose signature, payload, kid or descriptor were changed after signing.',
    tags        : ['records', 'integrity'],
    async build(S) {
      const alice = await S.persona('alice', 'key');
      const mallory = await S.persona('mallory', 'key');
      const w = await seedRecords(S, alice);

      const sigFlipped = clone(w.message);
      const sig = sigFlipped.authorization.signature.signatures[0];
      sig.signature = flipBase64UrlChar(sig.signature, 5);
      await S.process(alice, sigFlipped, { data: w.data, want: 401, note: 'one signature byte changed' });

      const wrongKid = clone(w.message);
      const protectedHeader = Encoder.base64UrlToObject(wrongKid.authorization.signature.signatures[0].protected);
      protectedHeader.kid = `${alice.did}#not-a-key`;
      wrongKid.authorization.signature.signatures[0].protected = Encoder.stringToBase64Url(JSON.stringify(protectedHeader));
      await S.process(alice, wrongKid, { data: w.data, want: 401, note: 'kid with an unknown fragment (signature no longer matches either)' });

      const resigned = await writeSignedWithKid(S, alice, `${alice.did}#other`);
      await S.send(alice, resigned, { want: 401, note: 'kid fragment not in the DID document, signed by the right key' });

      const byMallory = await writeSignedWithKid(S, alice, alice.keyId, mallory.signer);
      await S.send(alice, byMallory, { want: 401, note: 'kid of alice, signed by another key' });

      const descChanged = clone(w.message);
      descChanged.descriptor.dataFormat = 'text/html';
      await S.process(alice, descChanged, { data: w.data, want: 400, note: 'descriptor changed after signing (descriptorCid mismatch)' });

      const tsChanged = clone(w.message);
      tsChanged.descriptor.messageTimestamp = S.at(5);
      await S.process(alice, tsChanged, { data: w.data, want: 400, note: 'messageTimestamp changed after signing' });

      const recordIdChanged = clone(w.message);
      recordIdChanged.recordId = 'bafyreigbtj4x7ip5legnfznufuopl4sg4knzc2cof6duas4b3q2fy6swua';
      await S.process(alice, recordIdChanged, { data: w.data, want: 400, note: 'recordId changed (no longer matches the signed payload)' });

      const twoSigs = clone(w.message);
      twoSigs.authorization.signature.signatures.push(twoSigs.authorization.signature.signatures[0]);
      await S.process(alice, twoSigs, { data: w.data, want: 400, note: 'two signatures' });

      const noAuth = clone(w.message);
      delete noAuth.authorization;
      await S.process(alice, noAuth, { data: w.data, want: 400, note: 'RecordsWrite without authorization' });

      const payloadSwapped = clone(w.message);
      const other = await seedRecords(S, alice);
      payloadSwapped.authorization.signature.payload = other.message.authorization.signature.payload;
      await S.process(alice, payloadSwapped, { data: w.data, want: 400, note: 'payload of another message' });

      await S.send(alice, w, { want: 202, note: 'the untouched message is fine' });

      const q = await query(S, { author: alice, filter: { schema: 'https://example.com/note' } });
      const qFlipped = clone(q.message);
      qFlipped.authorization.signature.signatures[0].signature = flipBase64UrlChar(qFlipped.authorization.signature.signatures[0].signature, 9);
      await S.query(alice, qFlipped, { want: 401, note: 'RecordsQuery with a bad signature' });
      const qChanged = clone(q.message);
      qChanged.descriptor.filter.schema = 'https://example.com/other';
      await S.query(alice, qChanged, { want: 400, note: 'RecordsQuery filter changed after signing' });

      const r = await read(S, { author: alice, filter: { recordId: w.recordId } });
      const rFlipped = clone(r.message);
      rFlipped.authorization.signature.signatures[0].signature = flipBase64UrlChar(rFlipped.authorization.signature.signatures[0].signature, 3);
      await S.process(alice, rFlipped, { want: 401, note: 'RecordsRead with a bad signature' });

      const d = await del(S, { author: alice, recordId: w.recordId });
      const dFlipped = clone(d.message);
      dFlipped.authorization.signature.signatures[0].signature = flipBase64UrlChar(dFlipped.authorization.signature.signatures[0].signature, 7);
      await S.process(alice, dFlipped, { want: 401, note: 'RecordsDelete with a bad signature' });
      const dChanged = clone(d.message);
      dChanged.descriptor.recordId = other.recordId;
      await S.process(alice, dChanged, { want: 400, note: 'RecordsDelete recordId changed after signing' });
      await S.process(alice, d.message, { want: 202, note: 'the untouched delete is fine' });
    },
  },

  {
    name        : 'records-unknown-properties',
    description : 'Unknown properties anywhere in a message are refused (400); so are missing required ones.',
    tags        : ['records', 'integrity'],
    async build(S) {
      const alice = await S.persona('alice', 'jwk');
      const w = await seedRecords(S, alice);
      const cases = [
        ['top-level property', (m) => { m.extra = 1; }],
        ['descriptor property added after signing (schema check comes first)', (m) => { m.descriptor.color = 'red'; }],
        ['authorization property', (m) => { m.authorization.note = 'x'; }],
        ['encodedData inside the message', (m) => { m.encodedData = 'aGk'; }],
        ['missing recordId', (m) => { delete m.recordId; }],
        ['interface misspelled', (m) => { m.descriptor.interface = 'record'; }],
        ['method unknown', (m) => { m.descriptor.method = 'Upsert'; }],
      ];
      for (const [label, mutate] of cases) {
        const m = clone(w.message);
        mutate(m);
        await S.process(alice, m, { data: w.data, want: 400, note: label });
      }
      // the same kind of defects, signed over so that only the message schema can object
      const signedCases = [
        ['missing dataFormat', (d) => { delete d.dataFormat; }],
        ['dataSize a string', (d) => { d.dataSize = '13'; }],
        ['dataSize negative (no schema minimum: the data check refuses it)', (d) => { d.dataSize = -1; }],
        ['published a string', (d) => { d.published = 'true'; d.datePublished = d.messageTimestamp; }],
        ['published without datePublished', (d) => { d.published = true; }],
        ['recipient not a DID', (d) => { d.recipient = 'bob'; }],
        ['protocol without protocolPath', (d) => { d.protocol = 'https://example.com/p'; }],
        ['tags with a nested object', (d) => { d.tags = { a: { b: 1 } }; }],
      ];
      for (const [label, mutate] of signedCases) {
        const m = await writeWithMutatedDescriptor(S, { author: alice, data: bytes('hello p2psync'), mutate });
        await S.send(alice, m, { want: 400, note: `${label} (signed)` });
      }
      const signedUnknown = await writeWithMutatedDescriptor(S, {
        author : alice,
        data   : bytes('signed with an extra descriptor property'),
        mutate : (d) => { d.color = 'blue'; },
      });
      await S.send(alice, signedUnknown, { want: 400, note: 'unknown descriptor property, signed over' });
      const q = await query(S, { author: alice, filter: { schema: 'https://example.com/note' } });
      const qExtra = clone(q.message);
      qExtra.descriptor.filter.colour = 'red';
      await S.query(alice, qExtra, { want: 400, note: 'unknown filter property in a query' });
      await S.send(alice, w, { want: 202, note: 'the original is fine' });
      const other = await write(S, { author: alice, data: bytes('unprotected header') });
      const withHeader = clone(other.message);
      withHeader.authorization.signature.signatures[0].header = {};
      await S.process(alice, withHeader, { data: other.data, want: 202, note: 'an extra (unprotected) header member in the signature entry is tolerated' });
    },
  },

  {
    name        : 'records-unnormalized-urls',
    description : 'create() normalizes schema and protocol URLs; a hand-signed unnormalized URL is refused (400).',
    tags        : ['records', 'integrity'],
    async build(S) {
      const alice = await S.persona('alice', 'key');
      const normalized = await write(S, { author: alice, data: bytes('n'), schema: 'example.com/schema' });
      await S.send(alice, normalized, { want: 202, note: `create() normalized the schema to ${normalized.message.descriptor.schema}` });
      for (const schema of ['example.com/schema', 'https://example.com/schema/', 'HTTPS://EXAMPLE.COM/schema', 'https://example.com/schema?x=1#frag']) {
        const m = await writeWithMutatedDescriptor(S, { author: alice, data: bytes('u'), mutate: (d) => { d.schema = schema; } });
        await S.send(alice, m, { want: 400, note: `hand-signed schema ${schema}` });
      }
      const q = await query(S, { author: alice, filter: { schema: 'example.com/schema' } });
      await S.query(alice, q.message, { want: 200, note: `query filter normalized by create() to ${q.message.descriptor.filter.schema}` });
      const qBad = await signedQueryWithFilter(S, alice, { schema: 'example.com/schema' });
      await S.query(alice, qBad, { want: 400, note: 'hand-signed query with an unnormalized schema' });
      const qBadProto = await signedQueryWithFilter(S, alice, { protocol: 'example.com/proto' });
      await S.query(alice, qBadProto, { want: 400, note: 'hand-signed query with an unnormalized protocol' });
    },
  },

  {
    name        : 'records-timestamps',
    description : 'Malformed or inconsistent timestamps are refused (400).',
    tags        : ['records', 'integrity'],
    async build(S) {
      const alice = await S.persona('alice', 'key');
      const cases = [
        ['milliseconds only', { messageTimestamp: '2024-03-01T00:00:10.000Z', dateCreated: '2024-03-01T00:00:10.000Z' }],
        ['no fraction', { messageTimestamp: '2024-03-01T00:00:10Z', dateCreated: '2024-03-01T00:00:10Z' }],
        ['offset instead of Z', { messageTimestamp: '2024-03-01T00:00:10.000000+00:00', dateCreated: '2024-03-01T00:00:10.000000+00:00' }],
        ['February 30th', { messageTimestamp: '2024-02-30T00:00:10.000000Z', dateCreated: '2024-02-30T00:00:10.000000Z' }],
        ['month 13', { messageTimestamp: '2024-13-01T00:00:10.000000Z', dateCreated: '2024-13-01T00:00:10.000000Z' }],
        ['hour 25', { messageTimestamp: '2024-03-01T25:00:10.000000Z', dateCreated: '2024-03-01T25:00:10.000000Z' }],
        ['dateCreated differs from messageTimestamp on the initial write', { dateCreated: '2024-03-01T00:00:00.500000Z' }],
        ['malformed datePublished', { published: true, datePublished: '2024-03-01' }],
      ];
      for (const [label, fields] of cases) {
        const m = await writeWithMutatedDescriptor(S, {
          author : alice,
          data   : bytes(label),
          mutate : (d) => { Object.assign(d, fields); },
        });
        await S.send(alice, m, { want: 400, note: label });
      }
      const ok = await write(S, { author: alice, data: bytes('fine') });
      await S.send(alice, ok, { want: 202, note: 'a well-formed write' });
      const q = await query(S, { author: alice, filter: { dataFormat: 'text/plain' } });
      const qBad = clone(q.message);
      qBad.descriptor.messageTimestamp = '2024-03-01';
      await S.query(alice, qBad, { want: 400, note: 'query with a malformed timestamp' });
    },
  },

  {
    name        : 'records-owner-retained',
    description : 'A tenant keeps a copy of a record authored by someone else by adding an owner signature.',
    tags        : ['records', 'authorization'],
    async build(S) {
      const alice = await S.persona('alice', 'key');
      const bob = await S.persona('bob', 'jwk');
      const carol = await S.persona('carol', 'key');
      const w = await write(S, { author: bob, data: bytes('bob wrote this'), schema: 'https://example.com/shared', published: true });
      await S.send(bob, w, { want: 202, note: 'bob writes in his own DWN' });
      await S.send(alice, w, { want: 401, note: 'the same message into alice\'s DWN: not authorized' });
      const owned = await RecordsWrite.parse(w.message);
      await owned.signAsOwner(alice.signer);
      await S.process(alice, owned.message, { data: w.data, want: 202, note: 'with alice\'s owner signature: retained' });
      const r = await read(S, { author: alice, filter: { recordId: w.recordId } });
      await S.process(alice, r.message, { want: 200, note: 'alice reads her copy' });
      const byCarol = await RecordsWrite.parse(w.message);
      await byCarol.signAsOwner(carol.signer);
      await S.process(alice, byCarol.message, { data: w.data, want: 401, note: 'owner signature by carol (not the tenant)' });
      const bad = clone(owned.message);
      bad.authorization.ownerSignature.signatures[0].signature = flipBase64UrlChar(bad.authorization.ownerSignature.signatures[0].signature, 4);
      await S.process(alice, bad, { data: w.data, want: 401, note: 'owner signature with a flipped byte' });
    },
  },

  {
    name        : 'records-did-methods',
    description : 'did:jwk and did:key tenants and authors side by side.',
    tags        : ['records', 'did'],
    async build(S) {
      const bob = await S.persona('bob', 'jwk');
      const dave = await S.persona('dave', 'jwk');
      const alice = await S.persona('alice', 'key');
      const w = await write(S, { author: bob, data: bytes('jwk tenant'), recipient: alice.did, published: false });
      await S.send(bob, w, { want: 202, note: 'did:jwk tenant writes' });
      const r = await read(S, { author: alice, filter: { recordId: w.recordId } });
      await S.process(bob, r.message, { want: 200, note: 'did:key recipient reads from a did:jwk tenant' });
      const r2 = await read(S, { author: dave, filter: { recordId: w.recordId } });
      await S.process(bob, r2.message, { want: 401, note: 'another did:jwk cannot' });
      const wd = await write(S, { author: dave, data: bytes('dave'), recipient: bob.did });
      await S.send(dave, wd, { want: 202, note: 'did:jwk dave writes for bob' });
      const q = await query(S, { author: bob, filter: { recipient: bob.did } });
      await S.query(dave, q.message, { want: 200, note: 'bob queries dave\'s DWN for records addressed to him' });
      await S.send(alice, wd, { want: 401, note: 'dave\'s record sent to alice\'s DWN' });
    },
  },

  {
    name        : 'records-publish-toggle',
    description : 'Publishing and unpublishing a record by updates: anonymous reads and queries follow the newest state; datePublished is kept while published.',
    tags        : ['records', 'updates', 'read'],
    async build(S) {
      const alice = await S.persona('alice', 'jwk');
      const bob = await S.persona('bob', 'key');
      const w = await write(S, { author: alice, data: bytes('sometimes public'), schema: 'https://example.com/toggle' });
      await S.send(alice, w, { want: 202, note: 'unpublished initial write' });
      const anon = async (note, want) => {
        const r = await read(S, { filter: { recordId: w.recordId } });
        await S.process(alice, r.message, { want, note: `anonymous read: ${note}` });
        const q = await query(S, { filter: { schema: 'https://example.com/toggle' } });
        await S.query(alice, q.message, { want: 200, note: `anonymous query: ${note}` });
      };
      await anon('unpublished', 401);
      const pub = await update(S, { author: alice, from: w.message, published: true });
      await S.send(alice, pub, { withData: false, want: 202, note: 'publish (no data sent)' });
      await anon('published', 200);
      const pub2 = await update(S, { author: alice, from: pub.message, data: bytes('still public, new data') });
      await S.send(alice, pub2, { want: 202, note: 'new data, stays published with the same datePublished' });
      const byDate = await query(S, { author: bob, filter: { datePublished: { from: pub.message.descriptor.datePublished } } });
      await S.query(alice, byDate.message, { want: 200, note: 'bob queries by datePublished' });
      const unpub = await update(S, { author: alice, from: pub2.message, published: false });
      await S.send(alice, unpub, { withData: false, want: 202, note: 'unpublish' });
      await anon('unpublished again', 401);
      const bobRead = await read(S, { author: bob, filter: { recordId: w.recordId } });
      await S.process(alice, bobRead.message, { want: 401, note: 'bob reads the unpublished record' });
      const republishOld = await update(S, { author: alice, from: pub2.message, published: true, timestamp: Time.createOffsetTimestamp({ seconds: -1 }, unpub.message.descriptor.messageTimestamp) });
      await S.send(alice, republishOld, { withData: false, want: 409, note: 'a publish older than the unpublish' });
    },
  },

  {
    name        : 'records-large-data-updates',
    description : 'Updates moving a record between inline data (<= 30,000 bytes) and the data store, with and without new data.',
    tags        : ['records', 'data', 'updates'],
    async build(S) {
      const alice = await S.persona('alice', 'key');
      const w = await write(S, { author: alice, data: bytes('small at first') });
      await S.send(alice, w, { want: 202, note: 'small initial write' });
      const rd = async (note) => {
        const r = await read(S, { author: alice, filter: { recordId: w.recordId } });
        await S.process(alice, r.message, { want: 200, note });
      };
      const big = await update(S, { author: alice, from: w.message, data: gen(100_000, 21) });
      await S.send(alice, big, { want: 202, note: 'update to 100,000 bytes' });
      await rd('reads the large data');
      const same = await update(S, { author: alice, from: big.message });
      await S.send(alice, same, { withData: false, want: 202, note: 'large update without data: taken from the data store' });
      await rd('still the large data');
      const bigger = await update(S, { author: alice, from: same.message, data: gen(300_000, 22) });
      await S.send(alice, bigger, { want: 202, note: 'update to 300,000 bytes (multi-block CID)' });
      await rd('reads the 300,000 bytes');
      const stale = await update(S, { author: alice, from: big.message, data: gen(100_000, 21), timestamp: Time.createOffsetTimestamp({ seconds: -1 }, bigger.message.descriptor.messageTimestamp) });
      await S.send(alice, stale, { want: 409, note: 'older update with the previous large data' });
      const small = await update(S, { author: alice, from: bigger.message, data: bytes('small again') });
      await S.send(alice, small, { want: 202, note: 'back to inline data' });
      await rd('reads the small data');
      const reuseOld = await update(S, { author: alice, from: big.message });
      await S.send(alice, reuseOld, { withData: false, want: 400, note: 'update without data pointing at the old large dataCid' });
      const q = await query(S, { author: alice, filter: { recordId: w.recordId } });
      await S.query(alice, q.message, { want: 200, note: 'one entry, newest write, initial write attached' });
    },
  },

  {
    name        : 'pipe-malformed-requests',
    description : 'Requests the pipe must answer with 400 without dying, followed by a normal write.',
    tags        : ['pipe'],
    async build(S) {
      const alice = await S.persona('alice', 'key');
      await S.process(alice, {}, { want: 400, note: 'empty message' });
      await S.process(alice, { descriptor: { interface: 'Records' } }, { want: 400, note: 'descriptor without method' });
      await S.process(alice, { descriptor: { interface: 'Records', method: 'Write' } }, { want: 400, note: 'RecordsWrite with nothing else' });
      await S.process(alice, { descriptor: { interface: 'Records', method: 'Query', filter: {}, messageTimestamp: '2024-03-01T00:00:00.000000Z' } }, { want: 400, note: 'unsigned query with an empty filter' });
      await S.process(alice, { descriptor: { interface: 'Records', method: 'Query', filter: { dataFormat: 'text/plain' }, messageTimestamp: '2024-03-01T00:00:00.000000Z' } }, { want: 200, note: 'unsigned query: published records only (none yet)' });
      await S.process(alice, { descriptor: { interface: 'Messages', method: 'Frobnicate' } }, { want: 400, note: 'unknown method' });
      await S.raw('this is not JSON', { want: 400, note: 'a line that is not JSON' });
      await S.raw('[1, 2, 3]', { want: 400, note: 'a JSON array instead of an object' });
      await S.raw('"process"', { want: 400, note: 'a JSON string instead of an object' });
      await S.raw('{}', { want: 400, note: 'an empty object' });
      await S.raw(`{"op":"frobnicate","tenant":"${alice.did}","message":{}}`, { want: 400, note: 'an op no pipe knows (cid of the message still reported)' });
      await S.raw(`{"op":"process","message":{}}`, { want: 400, note: 'no tenant' });
      await S.raw(`{"op":"process","tenant":"${alice.did}"}`, { want: 400, note: 'no message' });
      await S.raw(`{"op":"process","tenant":"${alice.did}","message":[]}`, { want: 400, note: 'message is an array' });
      const w = await write(S, { author: alice, data: bytes('still alive') });
      await S.raw(JSON.stringify({ op: 'process', tenant: alice.did, message: w.message, data: '!!not base64url!!' }), { want: 400, note: 'data that is not base64url (the message CID is still reported)' });
      await S.raw(JSON.stringify({ op: 'process', tenant: alice.did, message: w.message, data: 12 }), { want: 400, note: 'data that is not a string' });
      await S.step({ op: 'process', tenant: alice, message: w.message, data: bytes('still alive'), want: 202, note: 'a normal write after the junk' });
    },
  },
];

/** Flips one base64url character of `s` (at `index`) to another valid one. */
function flipBase64UrlChar(s, index) {
  const c = s[index];
  const replacement = c === 'A' ? 'B' : 'A';
  return s.slice(0, index) + replacement + s.slice(index + 1);
}

/** A RecordsWrite signed with an arbitrary kid (and optionally another key). */
async function writeSignedWithKid(S, author, keyId, signer = author.signer) {
  const data = bytes(`signed with ${keyId}`);
  const ts = S.tick();
  const recordsWrite = await RecordsWrite.create({ data: data.bytes, dataFormat: 'text/plain', messageTimestamp: ts, dateCreated: ts });
  const kidSigner = { keyId, algorithm: signer.algorithm, sign: (content) => signer.sign(content) };
  await recordsWrite.sign({ signer: kidSigner });
  return { message: recordsWrite.message, data, recordId: recordsWrite.message.recordId };
}

/** A RecordsQuery signed over a filter that create() would have normalized. */
async function signedQueryWithFilter(S, author, filter) {
  const q = await RecordsQuery.create({ filter: { dataFormat: 'text/plain' }, signer: author.signer, messageTimestamp: S.tick() });
  const descriptor = { ...q.message.descriptor, filter };
  const authorization = await Message.createAuthorization({ descriptor, signer: author.signer });
  return { descriptor, authorization };
}

/** published:false sorted by datePublished, which create() refuses to build. */
async function writeQueryWithPublishedSortOnUnpublished(S, author) {
  const q = await RecordsQuery.create({ filter: { published: false }, signer: author.signer, messageTimestamp: S.tick() });
  const descriptor = { ...q.message.descriptor, dateSort: DateSort.PublishedAscending };
  const authorization = await Message.createAuthorization({ descriptor, signer: author.signer });
  return { descriptor, authorization };
}
