// Scenarios for protocols: ProtocolsConfigure/Query, and records written, read, queried and
// deleted under protocol rules (structure, types, $size, $tags, $role, $actions).

import { DateSort, Message, ProtocolsConfigure } from '@tbd54566975/dwn-sdk-js';

import { bytes, configure, del, gen, json, protocolsQuery, query, read, update, write } from './scenario.mjs';

const BASE = 'https://p2psync.example/protocols';

/** Posts with comments and reactions; anyone may comment, only comment authors react. */
export const SOCIAL = {
  protocol  : `${BASE}/social`,
  published : true,
  types     : {
    post     : { schema: 'https://p2psync.example/schemas/post', dataFormats: ['application/json', 'text/plain'] },
    comment  : { schema: 'https://p2psync.example/schemas/comment', dataFormats: ['text/plain'] },
    reaction : { dataFormats: ['text/plain'] },
    image    : { dataFormats: ['image/png'] },
  },
  structure: {
    post: {
      $actions : [{ who: 'anyone', can: ['read'] }],
      comment  : {
        $actions: [
          { who: 'anyone', can: ['create', 'read'] },
          { who: 'author', of: 'post', can: ['co-delete'] },
        ],
        reaction: {
          $actions: [{ who: 'author', of: 'post/comment', can: ['create', 'read'] }],
        },
      },
      image: {
        $size    : { min: 10, max: 1000 },
        $actions : [{ who: 'anyone', can: ['read'] }],
      },
    },
  },
};

/** Threads anyone may open, with replies for the thread's recipient and author, and votes. */
export const FORUM = {
  protocol  : `${BASE}/forum`,
  published : false,
  types     : { thread: {}, reply: {}, vote: {} },
  structure : {
    thread: {
      $actions: [
        { who: 'anyone', can: ['create', 'update'] },
        { who: 'recipient', can: ['co-update', 'co-delete'] },
      ],
      reply: {
        $actions: [
          { who: 'recipient', of: 'thread', can: ['create', 'read'] },
          { who: 'author', of: 'thread', can: ['create', 'read', 'co-delete'] },
        ],
        vote: {
          $actions: [{ who: 'author', of: 'thread/reply', can: ['create', 'delete'] }],
        },
      },
    },
  },
};

/** Roles at the root (friend, admin) and in a thread's context (participant). */
export const CHAT = {
  protocol  : `${BASE}/chat`,
  published : false,
  types     : { friend: {}, admin: {}, thread: {}, participant: {}, message: {} },
  structure : {
    friend : { $role: true },
    admin  : { $role: true },
    thread : {
      $actions: [
        { role: 'friend', can: ['create', 'read', 'query', 'subscribe'] },
        { role: 'admin', can: ['co-update', 'co-delete', 'read', 'query', 'subscribe'] },
      ],
      participant: {
        $role    : true,
        $actions : [{ who: 'author', of: 'thread', can: ['create'] }],
      },
      message: {
        $actions: [
          { role: 'thread/participant', can: ['create', 'read', 'query', 'subscribe'] },
        ],
      },
    },
  },
};

/** $tags rules. */
export const TASKS = {
  protocol  : `${BASE}/tasks`,
  published : true,
  types     : { task: { dataFormats: ['application/json'] }, memo: {} },
  structure : {
    task: {
      $tags: {
        $requiredTags       : ['status'],
        $allowUndefinedTags : false,
        status              : { type: 'string', enum: ['open', 'doing', 'done'] },
        priority            : { type: 'integer', minimum: 1, maximum: 5 },
        labels              : { type: 'array', items: { type: 'string' }, maxItems: 3 },
        urgent              : { type: 'boolean' },
        estimate            : { type: 'number', exclusiveMinimum: 0 },
      },
    },
    memo: {
      $tags: { $allowUndefinedTags: true, kind: { type: 'string', minLength: 2 } },
    },
  },
};

/** Owner-only files with a size window. */
export const FILES = {
  protocol  : `${BASE}/files`,
  published : false,
  types     : { file: {}, thumb: {}, blob: {} },
  structure : {
    file: {
      $size : { min: 10, max: 1000 },
      thumb : { $size: { max: 0 } },
    },
    blob: { $size: { min: 30_001 } },
  },
};

function clone(obj) {
  return JSON.parse(JSON.stringify(obj));
}

/** A ProtocolsConfigure over `definition`, signed as is (create() would refuse or normalize it). */
export async function handSignedConfigure(S, author, definition) {
  const template = await ProtocolsConfigure.create({
    definition       : { protocol: `${BASE}/template`, published: false, types: {}, structure: {} },
    signer           : author.signer,
    messageTimestamp : S.tick(),
  });
  const descriptor = { ...template.message.descriptor, definition };
  const authorization = await Message.createAuthorization({ descriptor, signer: author.signer });
  return { descriptor, authorization };
}

async function setup(S, tenant, ...definitions) {
  for (const definition of definitions) {
    const c = await configure(S, { author: tenant, definition });
    await S.process(tenant, c.message, { want: 202, note: `configure ${definition.protocol}` });
  }
}

/** A protocol record under SOCIAL etc.: `path`, optional `parent` (an authored record). */
async function pwrite(S, { author, definition, path, parent, data = bytes(`${path} by ${author.name}`), dataFormat, schema, ...rest }) {
  const typeName = path.split('/').pop();
  const type = definition.types[typeName] ?? {};
  return write(S, {
    author,
    data,
    protocol        : definition.protocol,
    protocolPath    : path,
    schema          : schema ?? type.schema,
    dataFormat      : dataFormat ?? type.dataFormats?.[0] ?? 'text/plain',
    parentContextId : parent?.message.contextId,
    ...rest,
  });
}

export const scenarios = [
  {
    name        : 'protocols-configure-and-query',
    description : 'ProtocolsConfigure: accept, replay 409, older 409, newer replaces; ProtocolsQuery by owner, others and anonymous.',
    tags        : ['protocols'],
    async build(S) {
      const alice = await S.persona('alice', 'key');
      const bob = await S.persona('bob', 'jwk');
      const tEarly = S.tick();
      const social = await configure(S, { author: alice, definition: SOCIAL });
      await S.process(alice, social.message, { want: 202, note: 'configure a published protocol' });
      await S.process(alice, social.message, { want: 409, note: 'replay' });
      const older = await configure(S, { author: alice, definition: { ...SOCIAL, published: false }, timestamp: tEarly });
      await S.process(alice, older.message, { want: 409, note: 'an older configure of the same protocol' });
      const chat = await configure(S, { author: alice, definition: CHAT });
      await S.process(alice, chat.message, { want: 202, note: 'configure an unpublished protocol' });
      const q = async (who, filter, note, want = 200) => {
        const m = await protocolsQuery(S, { author: who, filter });
        await S.query(alice, m.message, { want, note });
      };
      await q(alice, undefined, 'owner queries all protocols');
      await q(alice, { protocol: SOCIAL.protocol }, 'owner queries one protocol');
      await q(alice, { protocol: `${BASE}/nothing` }, 'owner queries a protocol that is not configured');
      await q(bob, undefined, 'bob sees published protocols only');
      await q(undefined, undefined, 'anonymous sees published protocols only');
      await q(undefined, { protocol: CHAT.protocol }, 'anonymous asks for the unpublished one');
      const newer = await configure(S, { author: alice, definition: { ...SOCIAL, published: false } });
      await S.process(alice, newer.message, { want: 202, note: 'a newer configure replaces the older one (now unpublished)' });
      await q(alice, { protocol: SOCIAL.protocol }, 'owner sees only the newest configure');
      await q(bob, undefined, 'bob no longer sees it');
      const byBob = await configure(S, { author: bob, definition: FORUM });
      await S.process(alice, byBob.message, { want: 401, note: 'bob configures a protocol in alice\'s DWN' });
      await S.process(bob, byBob.message, { want: 202, note: 'bob configures it in his own DWN' });
      const tampered = clone(chat.message);
      tampered.descriptor.definition.published = true;
      await S.process(alice, tampered, { want: 400, note: 'definition changed after signing' });
      const flipped = clone(chat.message);
      const s = flipped.authorization.signature.signatures[0].signature;
      flipped.authorization.signature.signatures[0].signature = (s[0] === 'A' ? 'B' : 'A') + s.slice(1);
      await S.process(alice, flipped, { want: 401, note: 'bad signature' });
      const pq = await protocolsQuery(S, { author: alice, filter: { protocol: SOCIAL.protocol } });
      const pqBad = clone(pq.message);
      pqBad.descriptor.filter.protocol = 'p2psync.example/protocols/social';
      const reSigned = { descriptor: pqBad.descriptor, authorization: await Message.createAuthorization({ descriptor: pqBad.descriptor, signer: alice.signer }) };
      await S.query(alice, reSigned, { want: 400, note: 'ProtocolsQuery with an unnormalized protocol URL' });
    },
  },

  {
    name        : 'protocols-configure-invalid',
    description : 'Protocol definitions the reference refuses (400): role actions, action rules, $size, $tags, types, URLs, depth, schema.',
    tags        : ['protocols', 'integrity'],
    async build(S) {
      const alice = await S.persona('alice', 'key');
      const base = (structure, types = { a: {}, b: {}, r: {} }, extra = {}) => ({
        protocol: `${BASE}/invalid`, published: false, types, structure, ...extra,
      });
      const cases = [
        ['role granted read without query and subscribe', base({ r: { $role: true }, a: { $actions: [{ role: 'r', can: ['read'] }] } })],
        ['role granted read and query without subscribe', base({ r: { $role: true }, a: { $actions: [{ role: 'r', can: ['create', 'read', 'query'] }] } })],
        ['role path that is not a role', base({ r: {}, a: { $actions: [{ role: 'r', can: ['create'] }] } })],
        ['role path that does not exist', base({ a: { $actions: [{ role: 'nope', can: ['create'] }] } })],
        ['$size max below min', base({ a: { $size: { min: 10, max: 5 } } })],
        ['$size negative', base({ a: { $size: { min: -1 } } })],
        ['$tags with an invalid JSON schema', base({ a: { $tags: { color: { type: 'colour' } } } })],
        ['anyone with of', base({ a: { $actions: [{ who: 'anyone', of: 'a', can: ['create'] }] } })],
        ['author without of', base({ a: { $actions: [{ who: 'author', can: ['create'] }] } })],
        ['recipient without of may not read', base({ a: { $actions: [{ who: 'recipient', can: ['read'] }] } })],
        ['update without create', base({ a: { $actions: [{ who: 'anyone', can: ['update'] }] } })],
        ['delete without create', base({ a: { $actions: [{ who: 'anyone', can: ['delete'] }] } })],
        ['duplicate actor rules', base({ a: { $actions: [{ who: 'anyone', can: ['create'] }, { who: 'anyone', can: ['read'] }] } })],
        ['duplicate role rules', base({ r: { $role: true }, a: { $actions: [{ role: 'r', can: ['create'] }, { role: 'r', can: ['co-delete'] }] } })],
        ['rule set for an undeclared type', base({ a: { c: {} } })],
        ['unknown action', base({ a: { $actions: [{ who: 'anyone', can: ['fly'] }] } })],
        ['unknown actor', base({ a: { $actions: [{ who: 'everyone', can: ['create'] }] } })],
        ['unknown $ property in a rule set', base({ a: { $colour: 'red' } })],
        ['unnormalized protocol URL', { ...base({ a: {} }), protocol: 'p2psync.example/protocols/invalid' }],
        ['unnormalized schema URL', base({ a: {} }, { a: { schema: 'p2psync.example/schemas/a' } })],
        ['missing published', (() => { const d = base({ a: {} }); delete d.published; return d; })()],
        ['types not an object', base({ a: {} }, ['a'])],
        ['nesting deeper than 10 levels', base(nested(11), { a: {} })],
      ];
      for (const [label, definition] of cases) {
        const m = await handSignedConfigure(S, alice, definition);
        await S.process(alice, m, { want: 400, note: label });
      }
      const okCases = [
        ['role granted all three read actions', base({ r: { $role: true }, a: { $actions: [{ role: 'r', can: ['create', 'read', 'query', 'subscribe'] }] } })],
        ['nesting of exactly 10 levels', base(nested(10), { a: {} })],
      ];
      for (const [label, definition] of okCases) {
        const m = await handSignedConfigure(S, alice, definition);
        await S.process(alice, m, { want: 202, note: label });
      }
    },
  },

  {
    name        : 'protocols-record-structure',
    description : 'Records under a protocol must follow its structure: paths, parents, contextIds, types, schemas, data formats; unconfigured protocols are 400.',
    tags        : ['protocols', 'structure'],
    async build(S) {
      const alice = await S.persona('alice', 'key');
      const bob = await S.persona('bob', 'jwk');
      await setup(S, alice, SOCIAL, FORUM);
      const post = await pwrite(S, { author: alice, definition: SOCIAL, path: 'post' });
      await S.send(alice, post, { want: 202, note: 'post at the root' });
      const comment = await pwrite(S, { author: alice, definition: SOCIAL, path: 'post/comment', parent: post });
      await S.send(alice, comment, { want: 202, note: 'comment under the post' });
      const reaction = await pwrite(S, { author: alice, definition: SOCIAL, path: 'post/comment/reaction', parent: comment });
      await S.send(alice, reaction, { want: 202, note: 'reaction under the comment' });
      const rootComment = await pwrite(S, { author: alice, definition: SOCIAL, path: 'comment' });
      await S.send(alice, rootComment, { want: 400, note: 'comment at the root (no rule set there)' });
      const parentless = await pwrite(S, { author: alice, definition: SOCIAL, path: 'post/comment' });
      await S.send(alice, parentless, { want: 400, note: 'nested path without a parent' });
      const wrongLevel = await pwrite(S, { author: alice, definition: SOCIAL, path: 'post/reaction', parent: post });
      await S.send(alice, wrongLevel, { want: 400, note: 'declared type exists but not at this level' });
      const skipLevel = await pwrite(S, { author: alice, definition: SOCIAL, path: 'post/comment/reaction', parent: post });
      await S.send(alice, skipLevel, { want: 400, note: 'path skips a level of its parent' });
      const unknownType = await pwrite(S, { author: alice, definition: SOCIAL, path: 'video' });
      await S.send(alice, unknownType, { want: 400, note: 'type not in the protocol' });
      const wrongSchema = await pwrite(S, { author: alice, definition: SOCIAL, path: 'post', schema: 'https://p2psync.example/schemas/comment' });
      await S.send(alice, wrongSchema, { want: 400, note: 'schema of another type' });
      const noSchema = await write(S, { author: alice, data: bytes('x'), protocol: SOCIAL.protocol, protocolPath: 'post', dataFormat: 'text/plain' });
      await S.send(alice, noSchema, { want: 400, note: 'type requires a schema, none given' });
      const wrongFormat = await pwrite(S, { author: alice, definition: SOCIAL, path: 'post', dataFormat: 'text/html' });
      await S.send(alice, wrongFormat, { want: 400, note: 'data format not allowed for the type' });
      const otherFormat = await pwrite(S, { author: alice, definition: SOCIAL, path: 'post', dataFormat: 'text/plain' });
      await S.send(alice, otherFormat, { want: 202, note: 'second allowed data format' });
      const missingParent = await pwrite(S, { author: alice, definition: SOCIAL, path: 'post/comment', parent: { message: { contextId: 'bafyreigbtj4x7ip5legnfznufuopl4sg4knzc2cof6duas4b3q2fy6swua' } } });
      await S.send(alice, missingParent, { want: 400, note: 'parent does not exist' });
      const badContext = await pwrite(S, { author: alice, definition: SOCIAL, path: 'post/comment', parent: { message: { contextId: `${otherFormat.recordId}/${post.recordId}` } } });
      await S.send(alice, badContext, { want: 400, note: 'right parentId, wrong contextId prefix' });
      const thread = await pwrite(S, { author: alice, definition: FORUM, path: 'thread' });
      await S.send(alice, thread, { want: 202, note: 'thread in another protocol' });
      const crossProtocol = await pwrite(S, { author: alice, definition: SOCIAL, path: 'post/comment', parent: thread });
      await S.send(alice, crossProtocol, { want: 400, note: 'parent belongs to another protocol' });
      const unconfigured = await write(S, { author: alice, data: bytes('x'), protocol: `${BASE}/unconfigured`, protocolPath: 'thing', dataFormat: 'text/plain' });
      await S.send(alice, unconfigured, { want: 400, note: 'protocol not configured' });
      await S.send(bob, post, { want: 400, note: 'the same post in a DWN where the protocol is not configured' });
      const schemaChange = await write(S, {
        author       : alice,
        recordId     : post.recordId,
        dateCreated  : post.message.descriptor.dateCreated,
        data         : bytes('changed'),
        protocol     : SOCIAL.protocol,
        protocolPath : 'post',
        schema       : 'https://p2psync.example/schemas/comment',
        dataFormat   : 'application/json',
      });
      await S.send(alice, schemaChange, { want: 400, note: 'update changing the (immutable) schema' });
      const formatChange = await update(S, { author: alice, from: post.message, data: bytes('now plain text'), dataFormat: 'text/plain' });
      await S.send(alice, formatChange, { want: 202, note: 'update to another allowed data format' });
      const r = await read(S, { author: alice, filter: { protocol: SOCIAL.protocol, protocolPath: 'post/comment/reaction' } });
      await S.process(alice, r.message, { want: 200, note: 'read by protocol path' });
    },
  },

  {
    name        : 'protocols-size-limits',
    description : '$size min and max at their boundaries, on initial writes and updates, for the tenant too.',
    tags        : ['protocols', 'structure'],
    async build(S) {
      const alice = await S.persona('alice', 'jwk');
      await setup(S, alice, FILES);
      let file;
      for (const [size, want] of [[9, 400], [10, 202], [1000, 202], [1001, 400]]) {
        const w = await pwrite(S, { author: alice, definition: FILES, path: 'file', data: bytes(gen(size, size).bytes) });
        await S.send(alice, w, { want, note: `file of ${size} bytes (window 10..1000)` });
        if (want === 202) {
          file = w;
        }
      }
      const grow = await update(S, { author: alice, from: file.message, data: bytes(gen(1001, 3).bytes) });
      await S.send(alice, grow, { want: 400, note: 'update beyond max' });
      const shrink = await update(S, { author: alice, from: file.message, data: bytes(gen(500, 4).bytes) });
      await S.send(alice, shrink, { want: 202, note: 'update within the window' });
      const emptyThumb = await pwrite(S, { author: alice, definition: FILES, path: 'file/thumb', parent: file, data: bytes('') });
      await S.send(alice, emptyThumb, { want: 202, note: 'thumb with max 0: empty data' });
      const thumb = await pwrite(S, { author: alice, definition: FILES, path: 'file/thumb', parent: file, data: bytes('x') });
      await S.send(alice, thumb, { want: 400, note: 'thumb with max 0: one byte' });
      const smallBlob = await pwrite(S, { author: alice, definition: FILES, path: 'blob', data: gen(30_000, 1) });
      await S.send(alice, smallBlob, { want: 400, note: 'blob below min 30,001' });
      const bigBlob = await pwrite(S, { author: alice, definition: FILES, path: 'blob', data: gen(30_001, 1) });
      await S.send(alice, bigBlob, { want: 202, note: 'blob of exactly 30,001 bytes' });
      const noData = await pwrite(S, { author: alice, definition: FILES, path: 'file', data: bytes(gen(2000, 9).bytes) });
      await S.send(alice, noData, { withData: false, want: 400, note: 'size is checked on dataSize even without data' });
    },
  },

  {
    name        : 'protocols-tags',
    description : '$tags: required tags, types, enums, ranges, arrays, undefined tags; createFrom drops tags; queries by tag.',
    tags        : ['protocols', 'tags', 'query'],
    async build(S) {
      const alice = await S.persona('alice', 'key');
      await setup(S, alice, TASKS);
      const task = (tags, note, want, extra = {}) => ({ tags, note, want, extra });
      const cases = [
        task(undefined, 'no tags at all (status required)', 400),
        task({ priority: 2 }, 'required status missing', 400),
        task({ status: 'closed' }, 'status not in the enum', 400),
        task({ status: 'open', priority: 9 }, 'priority above maximum', 400),
        task({ status: 'open', priority: 0 }, 'priority below minimum', 400),
        task({ status: 'open', priority: 2.5 }, 'priority not an integer', 400),
        task({ status: 'open', priority: 'high' }, 'priority of the wrong type', 400),
        task({ status: 'open', labels: ['a', 'b', 'c', 'd'] }, 'too many labels', 400),
        task({ status: 'open', labels: [1, 2] }, 'labels of the wrong item type', 400),
        task({ status: 'open', urgent: 'yes' }, 'boolean tag given a string', 400),
        task({ status: 'open', estimate: 0 }, 'estimate not above exclusive minimum', 400),
        task({ status: 'open', color: 'red' }, 'undefined tag while $allowUndefinedTags is false', 400),
        task({ status: 'open' }, 'status only', 202),
        task({ status: 'doing', priority: 3, labels: ['ui', 'bug'], urgent: true, estimate: 1.5 }, 'every tag', 202),
        task({ status: 'done', priority: 5, labels: ['bug'] }, 'done task', 202),
        task({ status: 'open', priority: 1, labels: [] }, 'empty array as a tag value (message schema refuses it)', 400),
      ];
      const written = [];
      for (const c of cases) {
        const w = await pwrite(S, { author: alice, definition: TASKS, path: 'task', data: json({ n: written.length }), tags: c.tags });
        await S.send(alice, w, { want: c.want, note: `task: ${c.note}` });
        if (c.want === 202) {
          written.push(w);
        }
      }
      const memo = await pwrite(S, { author: alice, definition: TASKS, path: 'memo', tags: { kind: 'idea', anything: 42 } });
      await S.send(alice, memo, { want: 202, note: 'memo with an undefined tag (allowed there)' });
      const shortKind = await pwrite(S, { author: alice, definition: TASKS, path: 'memo', tags: { kind: 'x' } });
      await S.send(alice, shortKind, { want: 400, note: 'memo kind shorter than minLength' });
      const dropped = await update(S, { author: alice, from: written[0].message, data: json({ n: 'updated' }) });
      await S.send(alice, dropped, { want: 400, note: 'createFrom without tags drops them: required status missing' });
      const kept = await update(S, { author: alice, from: written[0].message, data: json({ n: 'updated' }), tags: { status: 'done' } });
      await S.send(alice, kept, { want: 202, note: 'update restating the tags' });
      const q = async (tags, note) => {
        const m = await query(S, { author: alice, filter: { protocol: TASKS.protocol, protocolPath: 'task', tags } });
        await S.query(alice, m.message, { want: 200, note });
      };
      await q({ status: 'done' }, 'tag equality (the updated task now matches)');
      await q({ status: 'open' }, 'tag equality: the update moved one task away');
      await q({ priority: { gte: 3 } }, 'numeric tag range');
      await q({ priority: { gt: 1, lte: 5 } }, 'numeric tag range, both ends');
      await q({ labels: 'bug' }, 'array tag contains');
      await q({ urgent: true }, 'boolean tag');
      await q({ status: { startsWith: 'do' } }, 'string tag prefix');
      await q({ status: 'done', labels: 'bug' }, 'two tags');
      const flat = await write(S, { author: alice, data: bytes('flat with tags'), tags: { topic: 'sync', level: 2 }, schema: 'https://p2psync.example/schemas/flat' });
      await S.send(alice, flat, { want: 202, note: 'flat-space record with tags (no rules apply)' });
      const fq = await query(S, { author: alice, filter: { schema: 'https://p2psync.example/schemas/flat', tags: { level: { lt: 3 } } } });
      await S.query(alice, fq.message, { want: 200, note: 'flat-space query by tag range' });
    },
  },

  {
    name        : 'protocols-actions-who',
    description : '$actions for anyone, author-of, recipient-of and recipient: create, update, co-update, read, co-delete, delete.',
    tags        : ['protocols', 'authorization'],
    async build(S) {
      const alice = await S.persona('alice', 'key');
      const bob = await S.persona('bob', 'jwk');
      const carol = await S.persona('carol', 'key');
      const dave = await S.persona('dave', 'jwk');
      await setup(S, alice, FORUM);
      const thread = await pwrite(S, { author: bob, definition: FORUM, path: 'thread', recipient: carol.did });
      await S.send(alice, thread, { want: 202, note: 'bob opens a thread (anyone: create), recipient carol' });
      const bobUpdate = await update(S, { author: bob, from: thread.message, data: bytes('edited by bob') });
      await S.send(alice, bobUpdate, { want: 202, note: 'bob updates his thread (anyone: update)' });
      const daveUpdate = await update(S, { author: dave, from: bobUpdate.message, data: bytes('edited by dave') });
      await S.send(alice, daveUpdate, { want: 401, note: 'dave updates bob\'s thread (update covers own records only)' });
      const carolUpdate = await update(S, { author: carol, from: bobUpdate.message, data: bytes('edited by carol') });
      await S.send(alice, carolUpdate, { want: 202, note: 'carol, the recipient, co-updates' });
      const anonRead = await read(S, { filter: { recordId: thread.recordId } });
      await S.process(alice, anonRead.message, { want: 401, note: 'anonymous read: no read rule for threads' });
      const daveRead = await read(S, { author: dave, filter: { recordId: thread.recordId } });
      await S.process(alice, daveRead.message, { want: 401, note: 'dave reads the thread' });
      const bobRead = await read(S, { author: bob, filter: { recordId: thread.recordId } });
      await S.process(alice, bobRead.message, { want: 401, note: 'bob (initial author) reads it: refused, the newest write is carol\'s and read judges its author' });
      const carolReply = await pwrite(S, { author: carol, definition: FORUM, path: 'thread/reply', parent: thread });
      await S.send(alice, carolReply, { want: 202, note: 'carol replies (recipient of thread: create)' });
      const bobReply = await pwrite(S, { author: bob, definition: FORUM, path: 'thread/reply', parent: thread });
      await S.send(alice, bobReply, { want: 202, note: 'bob replies (author of thread: create)' });
      const daveReply = await pwrite(S, { author: dave, definition: FORUM, path: 'thread/reply', parent: thread });
      await S.send(alice, daveReply, { want: 401, note: 'dave replies' });
      const bobReadsCarol = await read(S, { author: bob, filter: { recordId: carolReply.recordId } });
      await S.process(alice, bobReadsCarol.message, { want: 200, note: 'bob reads carol\'s reply (author of thread: read)' });
      const daveReadsCarol = await read(S, { author: dave, filter: { recordId: carolReply.recordId } });
      await S.process(alice, daveReadsCarol.message, { want: 401, note: 'dave reads carol\'s reply' });
      const carolVote = await pwrite(S, { author: carol, definition: FORUM, path: 'thread/reply/vote', parent: carolReply });
      await S.send(alice, carolVote, { want: 202, note: 'carol votes under her own reply (author of thread/reply)' });
      const carolVoteOnBob = await pwrite(S, { author: carol, definition: FORUM, path: 'thread/reply/vote', parent: bobReply });
      await S.send(alice, carolVoteOnBob, { want: 401, note: 'carol votes under bob\'s reply' });
      const carolUnvote = await del(S, { author: carol, recordId: carolVote.recordId });
      await S.process(alice, carolUnvote.message, { want: 202, note: 'carol deletes her vote (delete)' });
      const bobDeletesReply = await del(S, { author: bob, recordId: carolReply.recordId });
      await S.process(alice, bobDeletesReply.message, { want: 202, note: 'bob co-deletes carol\'s reply (author of thread: co-delete)' });
      const daveDeletesReply = await del(S, { author: dave, recordId: bobReply.recordId });
      await S.process(alice, daveDeletesReply.message, { want: 401, note: 'dave deletes bob\'s reply' });
      const carolDeletesBobReply = await del(S, { author: carol, recordId: bobReply.recordId });
      await S.process(alice, carolDeletesBobReply.message, { want: 401, note: 'carol deletes bob\'s reply (no rule)' });
      const daveQuery = await query(S, { author: dave, filter: { protocol: FORUM.protocol } });
      await S.query(alice, daveQuery.message, { want: 200, note: 'dave queries the protocol: nothing of his' });
      const bobQuery = await query(S, { author: bob, filter: { protocol: FORUM.protocol } });
      await S.query(alice, bobQuery.message, { want: 200, note: 'bob queries: what he authored' });
      const carolQuery = await query(S, { author: carol, filter: { protocol: FORUM.protocol } });
      await S.query(alice, carolQuery.message, { want: 200, note: 'carol queries: the thread (recipient; last written by her) and her vote' });
      const carolDeletesThread = await del(S, { author: carol, recordId: thread.recordId });
      await S.process(alice, carolDeletesThread.message, { want: 202, note: 'carol, the recipient, co-deletes the thread' });
      const late = await pwrite(S, { author: bob, definition: FORUM, path: 'thread/reply', parent: thread });
      await S.send(alice, late, { want: 400, note: 'reply under the deleted thread' });
    },
  },

  {
    name        : 'protocols-anyone-read-and-published',
    description : 'Anyone-read rules allow anonymous reads; anyone-create lets others write; published protocol records are visible to all.',
    tags        : ['protocols', 'authorization'],
    async build(S) {
      const alice = await S.persona('alice', 'key');
      const bob = await S.persona('bob', 'jwk');
      const carol = await S.persona('carol', 'key');
      await setup(S, alice, SOCIAL);
      const post = await pwrite(S, { author: alice, definition: SOCIAL, path: 'post' });
      await S.send(alice, post, { want: 202, note: 'alice posts (unpublished)' });
      const bobPost = await pwrite(S, { author: bob, definition: SOCIAL, path: 'post' });
      await S.send(alice, bobPost, { want: 401, note: 'bob may not post (only read)' });
      const anonRead = await read(S, { filter: { recordId: post.recordId } });
      await S.process(alice, anonRead.message, { want: 200, note: 'anonymous read allowed by the anyone-read rule' });
      const comment = await pwrite(S, { author: bob, definition: SOCIAL, path: 'post/comment', parent: post });
      await S.send(alice, comment, { want: 202, note: 'bob comments (anyone: create)' });
      const bobUpdate = await update(S, { author: bob, from: comment.message, data: bytes('bob edits his comment') });
      await S.send(alice, bobUpdate, { want: 401, note: 'bob updates his comment (no update rule)' });
      const carolReaction = await pwrite(S, { author: carol, definition: SOCIAL, path: 'post/comment/reaction', parent: comment });
      await S.send(alice, carolReaction, { want: 401, note: 'carol reacts to bob\'s comment (only its author may)' });
      const bobReaction = await pwrite(S, { author: bob, definition: SOCIAL, path: 'post/comment/reaction', parent: comment });
      await S.send(alice, bobReaction, { want: 202, note: 'bob reacts under his comment' });
      const carolReadsReaction = await read(S, { author: carol, filter: { recordId: bobReaction.recordId } });
      await S.process(alice, carolReadsReaction.message, { want: 401, note: 'carol reads the reaction' });
      const published = await pwrite(S, { author: alice, definition: SOCIAL, path: 'post', published: true });
      await S.send(alice, published, { want: 202, note: 'a published post' });
      const image = await pwrite(S, { author: alice, definition: SOCIAL, path: 'post/image', parent: published, data: bytes(gen(100, 2).bytes), dataFormat: 'image/png' });
      await S.send(alice, image, { want: 202, note: 'image under it' });
      const anonQuery = await query(S, { filter: { protocol: SOCIAL.protocol } });
      await S.query(alice, anonQuery.message, { want: 200, note: 'anonymous query: published records only' });
      const carolQuery = await query(S, { author: carol, filter: { protocol: SOCIAL.protocol, protocolPath: 'post' } });
      await S.query(alice, carolQuery.message, { want: 200, note: 'carol queries posts: published only (read rules do not extend queries)' });
      const bobQuery = await query(S, { author: bob, filter: { protocol: SOCIAL.protocol } });
      await S.query(alice, bobQuery.message, { want: 200, note: 'bob queries: published plus what he authored' });
      const aliceDeletesComment = await del(S, { author: alice, recordId: comment.recordId });
      await S.process(alice, aliceDeletesComment.message, { want: 202, note: 'tenant deletes bob\'s comment' });
      const carolDeletesPost = await del(S, { author: carol, recordId: post.recordId });
      await S.process(alice, carolDeletesPost.message, { want: 401, note: 'carol deletes alice\'s post' });
    },
  },

  {
    name        : 'protocols-roles',
    description : 'Root and context roles: assignment rules, invoking a role to create/read/query, role scope by context, admin co-update/co-delete, role removal.',
    tags        : ['protocols', 'roles', 'authorization'],
    async build(S) {
      const alice = await S.persona('alice', 'key');
      const bob = await S.persona('bob', 'jwk');
      const carol = await S.persona('carol', 'key');
      const dave = await S.persona('dave', 'jwk');
      const eve = await S.persona('eve', 'key');
      await setup(S, alice, CHAT);
      const noRecipient = await pwrite(S, { author: alice, definition: CHAT, path: 'friend' });
      await S.send(alice, noRecipient, { want: 400, note: 'role record without recipient' });
      const bobFriend = await pwrite(S, { author: alice, definition: CHAT, path: 'friend', recipient: bob.did });
      await S.send(alice, bobFriend, { want: 202, note: 'bob becomes a friend' });
      const bobFriendAgain = await pwrite(S, { author: alice, definition: CHAT, path: 'friend', recipient: bob.did });
      await S.send(alice, bobFriendAgain, { want: 400, note: 'a second friend record for bob' });
      const bobFriendUpdate = await update(S, { author: alice, from: bobFriend.message, data: bytes('still friends') });
      await S.send(alice, bobFriendUpdate, { want: 202, note: 'updating bob\'s own role record is fine' });
      const carolFriend = await pwrite(S, { author: alice, definition: CHAT, path: 'friend', recipient: carol.did });
      await S.send(alice, carolFriend, { want: 202, note: 'carol becomes a friend' });
      const eveAdmin = await pwrite(S, { author: alice, definition: CHAT, path: 'admin', recipient: eve.did });
      await S.send(alice, eveAdmin, { want: 202, note: 'eve becomes an admin' });
      const bobByBob = await pwrite(S, { author: bob, definition: CHAT, path: 'friend', recipient: dave.did });
      await S.send(alice, bobByBob, { want: 401, note: 'bob tries to make dave a friend' });

      const bobThread = await pwrite(S, { author: bob, definition: CHAT, path: 'thread', protocolRole: 'friend' });
      await S.send(alice, bobThread, { want: 202, note: 'bob opens a thread invoking friend' });
      const bobNoRole = await pwrite(S, { author: bob, definition: CHAT, path: 'thread' });
      await S.send(alice, bobNoRole, { want: 401, note: 'bob opens a thread without invoking the role' });
      const daveThread = await pwrite(S, { author: dave, definition: CHAT, path: 'thread', protocolRole: 'friend' });
      await S.send(alice, daveThread, { want: 401, note: 'dave invokes friend without a role record' });
      const notARole = await pwrite(S, { author: bob, definition: CHAT, path: 'thread', protocolRole: 'thread' });
      await S.send(alice, notARole, { want: 401, note: 'invoking a path that is not a role' });
      const wrongRole = await pwrite(S, { author: bob, definition: CHAT, path: 'thread', protocolRole: 'admin' });
      await S.send(alice, wrongRole, { want: 401, note: 'invoking admin, which bob does not hold' });
      const carolThread = await pwrite(S, { author: carol, definition: CHAT, path: 'thread', protocolRole: 'friend' });
      await S.send(alice, carolThread, { want: 202, note: 'carol opens a thread as friend' });

      const daveParticipant = await pwrite(S, { author: bob, definition: CHAT, path: 'thread/participant', parent: bobThread, recipient: dave.did });
      await S.send(alice, daveParticipant, { want: 202, note: 'bob (author of the thread) adds dave as participant' });
      const daveByCarol = await pwrite(S, { author: carol, definition: CHAT, path: 'thread/participant', parent: bobThread, recipient: eve.did });
      await S.send(alice, daveByCarol, { want: 401, note: 'carol adds a participant to bob\'s thread' });
      const daveAgain = await pwrite(S, { author: bob, definition: CHAT, path: 'thread/participant', parent: bobThread, recipient: dave.did });
      await S.send(alice, daveAgain, { want: 400, note: 'dave twice in the same thread' });
      const daveInCarols = await pwrite(S, { author: carol, definition: CHAT, path: 'thread/participant', parent: carolThread, recipient: dave.did });
      await S.send(alice, daveInCarols, { want: 202, note: 'dave in carol\'s thread too: another context, fine' });
      const msg = await pwrite(S, { author: dave, definition: CHAT, path: 'thread/message', parent: bobThread, protocolRole: 'thread/participant' });
      await S.send(alice, msg, { want: 202, note: 'dave posts in bob\'s thread as participant' });
      const msgByCarol = await pwrite(S, { author: carol, definition: CHAT, path: 'thread/message', parent: bobThread, protocolRole: 'thread/participant' });
      await S.send(alice, msgByCarol, { want: 401, note: 'carol is no participant of bob\'s thread' });

      const carolReads = await read(S, { author: carol, filter: { recordId: bobThread.recordId }, protocolRole: 'friend' });
      await S.process(alice, carolReads.message, { want: 200, note: 'carol reads bob\'s thread as friend' });
      const carolReadsNoRole = await read(S, { author: carol, filter: { recordId: bobThread.recordId } });
      await S.process(alice, carolReadsNoRole.message, { want: 401, note: 'without invoking the role' });
      const carolQueries = await query(S, { author: carol, filter: { protocol: CHAT.protocol, protocolPath: 'thread' }, protocolRole: 'friend' });
      await S.query(alice, carolQueries.message, { want: 200, note: 'carol queries all threads as friend' });
      const carolQueriesNoPath = await query(S, { author: carol, filter: { protocol: CHAT.protocol }, protocolRole: 'friend' });
      await S.query(alice, carolQueriesNoPath.message, { want: 400, note: 'role query without protocolPath' });
      const daveQueries = await query(S, { author: dave, filter: { protocol: CHAT.protocol, protocolPath: 'thread/message', contextId: bobThread.contextId }, protocolRole: 'thread/participant' });
      await S.query(alice, daveQueries.message, { want: 200, note: 'dave queries messages of bob\'s thread as participant' });
      const daveQueriesNoContext = await query(S, { author: dave, filter: { protocol: CHAT.protocol, protocolPath: 'thread/message' }, protocolRole: 'thread/participant' });
      await S.query(alice, daveQueriesNoContext.message, { want: 401, note: 'context role without a contextId' });
      const daveQueriesThreads = await query(S, { author: dave, filter: { protocol: CHAT.protocol, protocolPath: 'thread' }, protocolRole: 'friend' });
      await S.query(alice, daveQueriesThreads.message, { want: 401, note: 'dave is no friend' });

      const eveEdit = await update(S, { author: eve, from: bobThread.message, data: bytes('moderated'), protocolRole: 'admin' });
      await S.send(alice, eveEdit, { want: 202, note: 'eve co-updates bob\'s thread as admin' });
      const carolEdit = await update(S, { author: carol, from: bobThread.message, data: bytes('carol edits'), protocolRole: 'friend' });
      await S.send(alice, carolEdit, { want: 401, note: 'friends may not update others\' threads' });
      const eveDelete = await del(S, { author: eve, recordId: carolThread.recordId, protocolRole: 'admin' });
      await S.process(alice, eveDelete.message, { want: 202, note: 'eve co-deletes carol\'s thread as admin' });

      const unfriend = await del(S, { author: alice, recordId: bobFriend.recordId });
      await S.process(alice, unfriend.message, { want: 202, note: 'alice removes bob\'s friend role' });
      const bobAfter = await pwrite(S, { author: bob, definition: CHAT, path: 'thread', protocolRole: 'friend' });
      await S.send(alice, bobAfter, { want: 401, note: 'bob can no longer invoke friend' });
      const bobFriendNew = await pwrite(S, { author: alice, definition: CHAT, path: 'friend', recipient: bob.did });
      await S.send(alice, bobFriendNew, { want: 202, note: 'a new friend record for bob (the old one is deleted)' });
    },
  },

  {
    name        : 'protocols-tenant-bypass',
    description : 'The tenant skips $actions but not structure: path, type, $size, $tags, role recipients still apply.',
    tags        : ['protocols', 'authorization', 'structure'],
    async build(S) {
      const alice = await S.persona('alice', 'jwk');
      const bob = await S.persona('bob', 'jwk');
      await setup(S, alice, CHAT, TASKS, FILES, FORUM);
      const thread = await pwrite(S, { author: alice, definition: CHAT, path: 'thread' });
      await S.send(alice, thread, { want: 202, note: 'tenant writes a thread without any role' });
      const msg = await pwrite(S, { author: alice, definition: CHAT, path: 'thread/message', parent: thread });
      await S.send(alice, msg, { want: 202, note: 'tenant writes a message without being participant' });
      const friend = await pwrite(S, { author: alice, definition: CHAT, path: 'friend' });
      await S.send(alice, friend, { want: 400, note: 'tenant role record without recipient' });
      const f1 = await pwrite(S, { author: alice, definition: CHAT, path: 'friend', recipient: bob.did });
      await S.send(alice, f1, { want: 202, note: 'tenant makes bob a friend' });
      const f2 = await pwrite(S, { author: alice, definition: CHAT, path: 'friend', recipient: bob.did });
      await S.send(alice, f2, { want: 400, note: 'tenant duplicates the role recipient' });
      const untagged = await pwrite(S, { author: alice, definition: TASKS, path: 'task', data: json({}) });
      await S.send(alice, untagged, { want: 400, note: 'tenant task without its required tag' });
      const big = await pwrite(S, { author: alice, definition: FILES, path: 'file', data: bytes(gen(2000, 1).bytes) });
      await S.send(alice, big, { want: 400, note: 'tenant file over $size max' });
      const wrongPath = await pwrite(S, { author: alice, definition: CHAT, path: 'message' });
      await S.send(alice, wrongPath, { want: 400, note: 'tenant writes at a path with no rule set' });
      const wrongType = await pwrite(S, { author: alice, definition: CHAT, path: 'thread/attachment', parent: thread });
      await S.send(alice, wrongType, { want: 400, note: 'tenant writes an undeclared type' });
      const forumThread = await pwrite(S, { author: bob, definition: FORUM, path: 'thread' });
      await S.send(alice, forumThread, { want: 202, note: 'bob opens a forum thread' });
      const tenantEdit = await update(S, { author: alice, from: forumThread.message, data: bytes('tenant edit') });
      await S.send(alice, tenantEdit, { want: 202, note: 'tenant updates bob\'s record' });
      const bobAfterTenant = await update(S, { author: bob, from: tenantEdit.message, data: bytes('bob again') });
      await S.send(alice, bobAfterTenant, { want: 202, note: 'bob updates again (he authored the initial write)' });
      const tenantReadAll = await query(S, { author: alice, filter: { protocol: CHAT.protocol } });
      await S.query(alice, tenantReadAll.message, { want: 200, note: 'tenant queries everything without roles' });
      const tenantDelete = await del(S, { author: alice, recordId: forumThread.recordId });
      await S.process(alice, tenantDelete.message, { want: 202, note: 'tenant deletes bob\'s thread' });
    },
  },

  {
    name        : 'protocols-query-filters',
    description : 'Queries by protocol, protocolPath, contextId (prefix), parentId, schema, recipient and sorts within a protocol.',
    tags        : ['protocols', 'query'],
    async build(S) {
      const alice = await S.persona('alice', 'key');
      const bob = await S.persona('bob', 'jwk');
      await setup(S, alice, SOCIAL, FORUM);
      const posts = [];
      for (let i = 0; i < 3; i++) {
        const p = await pwrite(S, { author: alice, definition: SOCIAL, path: 'post', data: bytes(`post ${i}`), dataFormat: 'text/plain', published: i !== 1 });
        await S.send(alice, p, { want: 202, note: `post ${i}` });
        posts.push(p);
      }
      const comments = [];
      for (let i = 0; i < 4; i++) {
        const parent = posts[i % 2];
        const author = i % 2 === 0 ? bob : alice;
        const c = await pwrite(S, { author, definition: SOCIAL, path: 'post/comment', parent, data: bytes(`comment ${i}`), recipient: i === 3 ? bob.did : undefined });
        await S.send(alice, c, { want: 202, note: `comment ${i} by ${author.name} on post ${i % 2}` });
        comments.push(c);
      }
      const reaction = await pwrite(S, { author: bob, definition: SOCIAL, path: 'post/comment/reaction', parent: comments[0] });
      await S.send(alice, reaction, { want: 202, note: 'reaction by bob under comment 0' });
      const thread = await pwrite(S, { author: alice, definition: FORUM, path: 'thread' });
      await S.send(alice, thread, { want: 202, note: 'a forum thread (another protocol)' });
      const q = async (who, filter, note, extra = {}) => {
        const m = await query(S, { author: who, filter, ...extra });
        await S.query(alice, m.message, { want: 200, note });
      };
      await q(alice, { protocol: SOCIAL.protocol }, 'everything in the protocol');
      await q(alice, { protocol: SOCIAL.protocol, protocolPath: 'post' }, 'posts');
      await q(alice, { protocol: SOCIAL.protocol, protocolPath: 'post/comment' }, 'comments');
      await q(alice, { protocol: SOCIAL.protocol, contextId: posts[0].contextId }, 'contextId of post 0: the post and all below it');
      await q(alice, { protocol: SOCIAL.protocol, contextId: comments[0].contextId }, 'contextId of comment 0: it and its reaction');
      await q(alice, { protocol: SOCIAL.protocol, parentId: posts[1].recordId }, 'children of post 1');
      await q(alice, { protocol: SOCIAL.protocol, protocolPath: 'post/comment', parentId: posts[0].recordId }, 'comments of post 0');
      await q(alice, { protocol: SOCIAL.protocol, schema: 'https://p2psync.example/schemas/comment' }, 'by schema within the protocol');
      await q(alice, { protocol: SOCIAL.protocol, recipient: bob.did }, 'by recipient within the protocol');
      await q(alice, { protocol: SOCIAL.protocol, author: bob.did }, 'by author within the protocol');
      await q(alice, { protocol: SOCIAL.protocol, protocolPath: 'post' }, 'posts, newest first', { dateSort: DateSort.CreatedDescending });
      await q(alice, { protocol: SOCIAL.protocol, protocolPath: 'post' }, 'posts by publication', { dateSort: DateSort.PublishedAscending });
      await q(alice, { protocol: FORUM.protocol }, 'the other protocol');
      await q(bob, { protocol: SOCIAL.protocol }, 'bob: published, authored by him, addressed to him');
      await q(bob, { protocol: SOCIAL.protocol, protocolPath: 'post/comment', published: false }, 'bob: unpublished comments he may see');
      await q(bob, { protocol: SOCIAL.protocol, contextId: posts[1].contextId }, 'bob within the unpublished post');
      await q(undefined, { protocol: SOCIAL.protocol, protocolPath: 'post' }, 'anonymous: published posts');
      await q(alice, { protocol: SOCIAL.protocol, contextId: posts[0].contextId }, 'limit 2 of a context', { pagination: { limit: 2 } });
    },
  },

  {
    name        : 'protocols-delete-and-prune',
    description : 'Deleting a protocol record keeps its children; pruning removes the whole subtree; who may prune.',
    tags        : ['protocols', 'delete'],
    async build(S) {
      const alice = await S.persona('alice', 'key');
      const bob = await S.persona('bob', 'jwk');
      await setup(S, alice, SOCIAL);
      const post = await pwrite(S, { author: alice, definition: SOCIAL, path: 'post' });
      await S.send(alice, post, { want: 202, note: 'post' });
      const c1 = await pwrite(S, { author: bob, definition: SOCIAL, path: 'post/comment', parent: post });
      await S.send(alice, c1, { want: 202, note: 'bob comments' });
      const r1 = await pwrite(S, { author: bob, definition: SOCIAL, path: 'post/comment/reaction', parent: c1, data: gen(31_000, 4), dataFormat: 'text/plain' });
      await S.send(alice, r1, { want: 202, note: 'bob reacts with a large reaction' });
      const c2 = await pwrite(S, { author: alice, definition: SOCIAL, path: 'post/comment', parent: post });
      await S.send(alice, c2, { want: 202, note: 'alice comments' });
      const bobDeletesOwn = await del(S, { author: bob, recordId: c1.recordId });
      await S.process(alice, bobDeletesOwn.message, { want: 401, note: 'bob deletes his comment (no delete rule)' });
      const bobPrune = await del(S, { author: bob, recordId: post.recordId, prune: true });
      await S.process(alice, bobPrune.message, { want: 401, note: 'bob prunes the post' });
      const delC1 = await del(S, { author: alice, recordId: c1.recordId });
      await S.process(alice, delC1.message, { want: 202, note: 'tenant deletes comment 1 without prune' });
      const readR1 = await read(S, { author: alice, filter: { recordId: r1.recordId } });
      await S.process(alice, readR1.message, { want: 200, note: 'its reaction survives' });
      const under = await pwrite(S, { author: bob, definition: SOCIAL, path: 'post/comment/reaction', parent: c1 });
      await S.send(alice, under, { want: 400, note: 'new reaction under the deleted comment' });
      const pruneDeleted = await del(S, { author: alice, recordId: c1.recordId, prune: true });
      await S.process(alice, pruneDeleted.message, { want: 202, note: 'pruning the already deleted comment' });
      const readR1b = await read(S, { author: alice, filter: { recordId: r1.recordId } });
      await S.process(alice, readR1b.message, { want: 404, note: 'now the reaction is gone' });
      const prune = await del(S, { author: alice, recordId: post.recordId, prune: true });
      await S.process(alice, prune.message, { want: 202, note: 'tenant prunes the post' });
      const readC2 = await read(S, { author: alice, filter: { recordId: c2.recordId } });
      await S.process(alice, readC2.message, { want: 404, note: 'comment 2 gone with the post' });
      const q = await query(S, { author: alice, filter: { protocol: SOCIAL.protocol } });
      await S.query(alice, q.message, { want: 200, note: 'nothing left in the protocol' });
      await S.process(alice, prune.message, { want: 404, note: 'replayed prune' });
      await S.send(alice, c2, { want: 400, note: 'replaying a pruned child: its parent is gone' });
      await S.send(alice, post, { want: 409, note: 'replaying the pruned post' });
    },
  },

  {
    name        : 'protocols-reconfigure',
    description : 'Records written under an older definition, then checked against a newer configure of the same protocol.',
    tags        : ['protocols', 'structure'],
    async build(S) {
      const alice = await S.persona('alice', 'key');
      const bob = await S.persona('bob', 'jwk');
      await setup(S, alice, SOCIAL);
      const post = await pwrite(S, { author: alice, definition: SOCIAL, path: 'post' });
      await S.send(alice, post, { want: 202, note: 'post under v1' });
      const comment = await pwrite(S, { author: bob, definition: SOCIAL, path: 'post/comment', parent: post });
      await S.send(alice, comment, { want: 202, note: 'bob comments under v1 (anyone may)' });
      const v2 = {
        ...SOCIAL,
        types     : { post: SOCIAL.types.post, comment: SOCIAL.types.comment },
        structure : { post: { comment: { $actions: [{ who: 'author', of: 'post', can: ['create', 'read'] }] } } },
      };
      const c2 = await configure(S, { author: alice, definition: v2 });
      await S.process(alice, c2.message, { want: 202, note: 'v2: no reactions, only the post author comments' });
      const comment2 = await pwrite(S, { author: bob, definition: SOCIAL, path: 'post/comment', parent: post });
      await S.send(alice, comment2, { want: 401, note: 'bob comments under v2' });
      const reaction = await pwrite(S, { author: bob, definition: SOCIAL, path: 'post/comment/reaction', parent: comment });
      await S.send(alice, reaction, { want: 400, note: 'reaction type no longer exists' });
      const anon = await read(S, { filter: { recordId: post.recordId } });
      await S.process(alice, anon.message, { want: 401, note: 'v2 has no anyone-read on posts' });
      const bobRead = await read(S, { author: bob, filter: { recordId: comment.recordId } });
      await S.process(alice, bobRead.message, { want: 200, note: 'bob still reads his own comment' });
    },
  },
];

function nested(depth) {
  // a, a/a, a/a/a, ... `depth` levels of the same type
  let ruleSet = {};
  for (let i = 0; i < depth; i++) {
    ruleSet = { a: ruleSet };
  }
  return ruleSet;
}


