// Scenarios for permissions (0.5.2 keeps grants, requests and revocations as records of its
// built-in permissions protocol): grant-authorized writes/reads/configures/queries, scope,
// conditions, expiry and revocation by message timestamp, and delegated grants.

import { DwnInterfaceName, DwnMethodName, Encoder, PermissionsProtocol, Time } from '@tbd54566975/dwn-sdk-js';

import { bytes, configure, del, grant, json, permissionRequest, protocolsQuery, query, read, revoke, update, write } from './scenario.mjs';

const BASE = 'https://p2psync.example/protocols';

/** Owner-only notes with attachments: nobody but the tenant (or a grantee) may write. */
export const NOTES = {
  protocol  : `${BASE}/notes`,
  published : false,
  types     : { note: { dataFormats: ['text/plain'] }, attachment: {} },
  structure : { note: { attachment: {} } },
};

/** A second owner-only protocol, to show grants do not reach beyond their scope. */
export const DIARY = {
  protocol  : `${BASE}/diary`,
  published : false,
  types     : { entry: {} },
  structure : { entry: {} },
};

/** Anyone may drop a letter into an inbox. */
export const INBOX = {
  protocol  : `${BASE}/inbox`,
  published : true,
  types     : { letter: {} },
  structure : { letter: { $actions: [{ who: 'anyone', can: ['create'] }] } },
};

const recordsScope = (method, protocol, extra = {}) => ({ interface: DwnInterfaceName.Records, method, protocol, ...extra });

async function setup(S, tenant, ...definitions) {
  for (const definition of definitions) {
    const c = await configure(S, { author: tenant, definition });
    await S.process(tenant, c.message, { want: 202, note: `configure ${definition.protocol}` });
  }
}

function note(S, author, { parent, path = 'note', protocol = NOTES, ...rest } = {}) {
  return write(S, {
    author,
    data            : bytes(`${path} by ${author.name} at ${S.at(1)}`),
    dataFormat      : 'text/plain',
    protocol        : protocol.protocol,
    protocolPath    : path,
    parentContextId : parent?.message.contextId,
    ...rest,
  });
}

export const scenarios = [
  {
    name        : 'permissions-grant-records-write',
    description : 'A Records.Write grant lets its grantee write within the protocol scope while it is active; outside scope, before or after its window, or for others: 401.',
    tags        : ['permissions', 'authorization'],
    async build(S) {
      const alice = await S.persona('alice', 'key');
      const bob = await S.persona('bob', 'jwk');
      const carol = await S.persona('carol', 'key');
      await setup(S, alice, NOTES, DIARY);
      const beforeGrant = S.tick();
      const g = await grant(S, { grantor: alice, grantee: bob, scope: recordsScope(DwnMethodName.Write, NOTES.protocol), seconds: 100 });
      const unstored = await note(S, bob, { permissionGrantId: g.id });
      await S.send(alice, unstored, { want: 401, note: 'grant not yet stored in alice\'s DWN' });
      await S.send(alice, g, { want: 202, note: 'alice stores the grant to bob (valid 100 s)' });
      await S.send(alice, g, { want: 409, note: 'grant replayed' });
      const ok = await note(S, bob, { permissionGrantId: g.id });
      await S.send(alice, ok, { want: 202, note: 'bob writes a note with the grant' });
      const noGrant = await note(S, bob);
      await S.send(alice, noGrant, { want: 401, note: 'bob writes without invoking the grant' });
      const outOfScope = await note(S, bob, { protocol: DIARY, path: 'entry', permissionGrantId: g.id });
      await S.send(alice, outOfScope, { want: 401, note: 'bob writes into another protocol with it' });
      const flat = await write(S, { author: bob, data: bytes('flat'), permissionGrantId: g.id });
      await S.send(alice, flat, { want: 401, note: 'bob writes a flat-space record with it' });
      const byCarol = await note(S, carol, { permissionGrantId: g.id });
      await S.send(alice, byCarol, { want: 401, note: 'carol invokes bob\'s grant' });
      const early = await note(S, bob, { permissionGrantId: g.id, timestamp: beforeGrant });
      await S.send(alice, early, { want: 401, note: 'message timestamp before the grant was issued' });
      const atExpiry = await note(S, bob, { permissionGrantId: g.id, timestamp: Time.createOffsetTimestamp({ seconds: 100 }, g.message.descriptor.messageTimestamp) });
      await S.send(alice, atExpiry, { want: 401, note: 'message timestamp equal to dateExpires' });
      const justBefore = await note(S, bob, { permissionGrantId: g.id, timestamp: Time.createOffsetTimestamp({ seconds: 99 }, g.message.descriptor.messageTimestamp) });
      await S.send(alice, justBefore, { want: 202, note: 'message timestamp 1 s before dateExpires' });
      const child = await note(S, bob, { path: 'note/attachment', parent: ok, permissionGrantId: g.id });
      await S.send(alice, child, { want: 202, note: 'attachment under bob\'s note, same grant' });
      const upd = await update(S, { author: bob, from: ok.message, data: bytes('bob edits'), permissionGrantId: g.id });
      await S.send(alice, upd, { want: 401, note: 'createFrom does not carry permissionGrantId: update without the grant' });
      const updWithGrant = await write(S, {
        author            : bob,
        recordId          : ok.recordId,
        dateCreated       : ok.message.descriptor.dateCreated,
        data              : bytes('bob edits with grant'),
        dataFormat        : 'text/plain',
        protocol          : NOTES.protocol,
        protocolPath      : 'note',
        permissionGrantId : g.id,
      });
      await S.send(alice, updWithGrant, { want: 202, note: 'update invoking the grant' });
      const readWithWriteGrant = await read(S, { author: bob, filter: { recordId: ok.recordId }, permissionGrantId: g.id });
      await S.process(alice, readWithWriteGrant.message, { want: 200, note: 'bob reads his own note (author may read; grant not needed)' });
      const aliceNote = await note(S, alice);
      await S.send(alice, aliceNote, { want: 202, note: 'alice writes her own note' });
      const readOther = await read(S, { author: bob, filter: { recordId: aliceNote.recordId }, permissionGrantId: g.id });
      await S.process(alice, readOther.message, { want: 401, note: 'a write grant does not allow reading alice\'s note' });
    },
  },

  {
    name        : 'permissions-grant-scopes-and-conditions',
    description : 'Grant scopes narrowed by protocolPath or contextId, and the publication condition (Required / Prohibited).',
    tags        : ['permissions', 'authorization'],
    async build(S) {
      const alice = await S.persona('alice', 'key');
      const bob = await S.persona('bob', 'jwk');
      await setup(S, alice, NOTES);
      const root = await note(S, alice);
      await S.send(alice, root, { want: 202, note: 'alice writes a note' });
      const other = await note(S, alice);
      await S.send(alice, other, { want: 202, note: 'and another' });
      const byPath = await grant(S, { grantor: alice, grantee: bob, scope: recordsScope(DwnMethodName.Write, NOTES.protocol, { protocolPath: 'note/attachment' }) });
      await S.send(alice, byPath, { want: 202, note: 'grant limited to protocolPath note/attachment' });
      const att = await note(S, bob, { path: 'note/attachment', parent: root, permissionGrantId: byPath.id });
      await S.send(alice, att, { want: 202, note: 'attachment within the path scope' });
      const top = await note(S, bob, { permissionGrantId: byPath.id });
      await S.send(alice, top, { want: 401, note: 'note outside the path scope' });
      const byContext = await grant(S, { grantor: alice, grantee: bob, scope: recordsScope(DwnMethodName.Write, NOTES.protocol, { contextId: root.contextId }) });
      await S.send(alice, byContext, { want: 202, note: 'grant limited to the context of the first note' });
      const inCtx = await note(S, bob, { path: 'note/attachment', parent: root, permissionGrantId: byContext.id });
      await S.send(alice, inCtx, { want: 202, note: 'attachment in that context' });
      const outCtx = await note(S, bob, { path: 'note/attachment', parent: other, permissionGrantId: byContext.id });
      await S.send(alice, outCtx, { want: 401, note: 'attachment in another context' });
      const required = await grant(S, { grantor: alice, grantee: bob, scope: recordsScope(DwnMethodName.Write, NOTES.protocol), conditions: { publication: 'Required' } });
      await S.send(alice, required, { want: 202, note: 'grant requiring publication' });
      const unpub = await note(S, bob, { permissionGrantId: required.id });
      await S.send(alice, unpub, { want: 401, note: 'unpublished write under it' });
      const pub = await note(S, bob, { permissionGrantId: required.id, published: true });
      await S.send(alice, pub, { want: 202, note: 'published write under it' });
      const prohibited = await grant(S, { grantor: alice, grantee: bob, scope: recordsScope(DwnMethodName.Write, NOTES.protocol), conditions: { publication: 'Prohibited' } });
      await S.send(alice, prohibited, { want: 202, note: 'grant prohibiting publication' });
      const pub2 = await note(S, bob, { permissionGrantId: prohibited.id, published: true });
      await S.send(alice, pub2, { want: 401, note: 'published write under it' });
      const unpub2 = await note(S, bob, { permissionGrantId: prohibited.id });
      await S.send(alice, unpub2, { want: 202, note: 'unpublished write under it' });
      const readGrant = await grant(S, { grantor: alice, grantee: bob, scope: recordsScope(DwnMethodName.Read, NOTES.protocol, { protocolPath: 'note' }) });
      await S.send(alice, readGrant, { want: 202, note: 'read grant for notes only' });
      const readNote = await read(S, { author: bob, filter: { recordId: other.recordId }, permissionGrantId: readGrant.id });
      await S.process(alice, readNote.message, { want: 200, note: 'bob reads alice\'s note with it' });
      const aliceAtt = await note(S, alice, { path: 'note/attachment', parent: other });
      await S.send(alice, aliceAtt, { want: 202, note: 'alice adds an attachment' });
      const readAtt = await read(S, { author: bob, filter: { recordId: aliceAtt.recordId }, permissionGrantId: readGrant.id });
      await S.process(alice, readAtt.message, { want: 401, note: 'attachment is outside the read grant\'s path' });
      const readNoGrant = await read(S, { author: bob, filter: { recordId: other.recordId } });
      await S.process(alice, readNoGrant.message, { want: 401, note: 'without invoking the grant' });
      const writeWithRead = await note(S, bob, { permissionGrantId: readGrant.id });
      await S.send(alice, writeWithRead, { want: 401, note: 'a read grant used to write' });
    },
  },

  {
    name        : 'permissions-revocation',
    description : 'Revocation is judged by message timestamps: messages signed before it stay valid even when processed later; signed at or after it: 401.',
    tags        : ['permissions', 'authorization'],
    async build(S) {
      const alice = await S.persona('alice', 'key');
      const bob = await S.persona('bob', 'jwk');
      const carol = await S.persona('carol', 'key');
      await setup(S, alice, NOTES);
      const g = await grant(S, { grantor: alice, grantee: bob, scope: recordsScope(DwnMethodName.Write, NOTES.protocol), seconds: 3600 });
      await S.send(alice, g, { want: 202, note: 'write grant to bob' });
      const rg = await grant(S, { grantor: alice, grantee: bob, scope: recordsScope(DwnMethodName.Read, NOTES.protocol), seconds: 3600 });
      await S.send(alice, rg, { want: 202, note: 'read grant to bob' });
      const aliceNote = await note(S, alice);
      await S.send(alice, aliceNote, { want: 202, note: 'alice writes a note' });
      const first = await note(S, bob, { permissionGrantId: g.id });
      await S.send(alice, first, { want: 202, note: 'bob writes under the grant' });
      const signedBefore = await note(S, bob, { permissionGrantId: g.id });
      const readBefore = await read(S, { author: bob, filter: { recordId: aliceNote.recordId }, permissionGrantId: rg.id });
      const wrongTag = await revoke(S, { grantor: alice, grantRecord: g, tags: { protocol: `${BASE}/diary` } });
      await S.send(alice, wrongTag, { want: 400, note: 'revocation whose protocol tag differs from the grant\'s scope' });
      const byBob = await revoke(S, { grantor: bob, grantRecord: g });
      await S.send(alice, byBob, { want: 401, note: 'bob tries to revoke the grant in alice\'s DWN' });
      const rev = await revoke(S, { grantor: alice, grantRecord: g, description: 'no longer needed' });
      await S.send(alice, rev, { want: 202, note: 'alice revokes the write grant' });
      const revRead = await revoke(S, { grantor: alice, grantRecord: rg });
      await S.send(alice, revRead, { want: 202, note: 'alice revokes the read grant' });
      await S.send(alice, signedBefore, { want: 202, note: 'write signed before the revocation, processed after it' });
      await S.process(alice, readBefore.message, { want: 200, note: 'read signed before the revocation, processed after it' });
      const sameInstant = await note(S, bob, { permissionGrantId: g.id, timestamp: rev.message.descriptor.messageTimestamp });
      await S.send(alice, sameInstant, { want: 401, note: 'write stamped exactly at the revocation' });
      const after = await note(S, bob, { permissionGrantId: g.id });
      await S.send(alice, after, { want: 401, note: 'write signed after the revocation' });
      const readAfter = await read(S, { author: bob, filter: { recordId: aliceNote.recordId }, permissionGrantId: rg.id });
      await S.process(alice, readAfter.message, { want: 401, note: 'read signed after the revocation' });
      const again = await revoke(S, { grantor: alice, grantRecord: g, description: 'twice' });
      await S.send(alice, again, { want: 202, note: 'a second revocation of the same grant' });
      const bobReadsRevocation = await read(S, { author: bob, filter: { recordId: rev.recordId } });
      await S.process(alice, bobReadsRevocation.message, { want: 200, note: 'revocations are readable by anyone' });
      const anonReadsRevocation = await read(S, { filter: { recordId: rev.recordId } });
      await S.process(alice, anonReadsRevocation.message, { want: 200, note: 'even anonymously' });
      const carolReadsGrant = await read(S, { author: carol, filter: { recordId: g.id } });
      await S.process(alice, carolReadsGrant.message, { want: 401, note: 'carol may not read bob\'s grant' });
      const bobReadsGrant = await read(S, { author: bob, filter: { recordId: g.id } });
      await S.process(alice, bobReadsGrant.message, { want: 200, note: 'bob, the grantee, may' });
      const bobQueriesGrants = await query(S, { author: bob, filter: { protocol: PermissionsProtocol.uri, protocolPath: 'grant' } });
      await S.query(alice, bobQueriesGrants.message, { want: 200, note: 'bob queries grants: the ones addressed to him' });
      const aliceQueriesRevocations = await query(S, { author: alice, filter: { protocol: PermissionsProtocol.uri, protocolPath: 'grant/revocation' } });
      await S.query(alice, aliceQueriesRevocations.message, { want: 200, note: 'alice lists revocations' });
      const byTag = await query(S, { author: alice, filter: { protocol: PermissionsProtocol.uri, tags: { protocol: NOTES.protocol } } });
      await S.query(alice, byTag.message, { want: 200, note: 'permission records tagged with the notes protocol' });
    },
  },

  {
    name        : 'permissions-requests-and-grant-records',
    description : 'Permission requests from anyone; grant and request records validated against the permissions schemas; who may read them.',
    tags        : ['permissions'],
    async build(S) {
      const alice = await S.persona('alice', 'key');
      const bob = await S.persona('bob', 'jwk');
      const carol = await S.persona('carol', 'key');
      await setup(S, alice, NOTES);
      const req = await permissionRequest(S, { requester: bob, scope: recordsScope(DwnMethodName.Write, NOTES.protocol), description: 'let me write notes' });
      await S.send(alice, req, { want: 202, note: 'bob asks alice for write access' });
      const aliceReadsReq = await read(S, { author: alice, filter: { recordId: req.id } });
      await S.process(alice, aliceReadsReq.message, { want: 200, note: 'alice reads the request' });
      const carolReadsReq = await read(S, { author: carol, filter: { recordId: req.id } });
      await S.process(alice, carolReadsReq.message, { want: 401, note: 'carol may not read it' });
      const badReq = await write(S, {
        author       : bob,
        data         : json({ scope: { interface: 'Records' } }),
        dataFormat   : 'application/json',
        protocol     : PermissionsProtocol.uri,
        protocolPath : 'request',
      });
      await S.send(alice, badReq, { want: 400, note: 'request whose data breaks the request schema' });
      const untagged = await write(S, {
        author       : bob,
        data         : json({ delegated: false, scope: recordsScope(DwnMethodName.Write, NOTES.protocol) }),
        dataFormat   : 'application/json',
        protocol     : PermissionsProtocol.uri,
        protocolPath : 'request',
      });
      await S.send(alice, untagged, { want: 400, note: 'protocol-scoped request without the protocol tag' });
      const wrongFormat = await write(S, {
        author       : bob,
        data         : json({ delegated: false, scope: { interface: 'Protocols', method: 'Query' } }),
        dataFormat   : 'text/plain',
        protocol     : PermissionsProtocol.uri,
        protocolPath : 'request',
      });
      await S.send(alice, wrongFormat, { want: 400, note: 'request with a data format other than application/json' });
      const g = await grant(S, { grantor: alice, grantee: bob, scope: recordsScope(DwnMethodName.Write, NOTES.protocol), requestId: req.id, description: 'granted' });
      await S.send(alice, g, { want: 202, note: 'alice grants the request' });
      const bobGrant = await grant(S, { grantor: bob, grantee: carol, scope: recordsScope(DwnMethodName.Write, NOTES.protocol) });
      await S.send(alice, bobGrant, { want: 401, note: 'bob writes a grant into alice\'s DWN' });
      const badExpiry = await write(S, {
        author       : alice,
        recipient    : bob.did,
        data         : json({ dateExpires: 'tomorrow', scope: { interface: 'Protocols', method: 'Query' } }),
        dataFormat   : 'application/json',
        protocol     : PermissionsProtocol.uri,
        protocolPath : 'grant',
      });
      await S.send(alice, badExpiry, { want: 400, note: 'grant with a malformed dateExpires' });
      const tagMismatch = await write(S, {
        author       : alice,
        recipient    : bob.did,
        data         : json({ dateExpires: S.at(1000), scope: recordsScope(DwnMethodName.Read, NOTES.protocol) }),
        dataFormat   : 'application/json',
        protocol     : PermissionsProtocol.uri,
        protocolPath : 'grant',
        tags         : { protocol: `${BASE}/diary` },
      });
      await S.send(alice, tagMismatch, { want: 400, note: 'grant whose protocol tag differs from its scope' });
      const pathAndContext = await write(S, {
        author       : alice,
        recipient    : bob.did,
        data         : json({ dateExpires: S.at(1000), scope: recordsScope(DwnMethodName.Read, NOTES.protocol, { protocolPath: 'note', contextId: 'abc' }) }),
        dataFormat   : 'application/json',
        protocol     : PermissionsProtocol.uri,
        protocolPath : 'grant',
        tags         : { protocol: NOTES.protocol },
      });
      await S.send(alice, pathAndContext, { want: 400, note: 'grant scoped by both protocolPath and contextId' });
      const msgGrant = await grant(S, { grantor: alice, grantee: carol, scope: { interface: DwnInterfaceName.Messages, method: DwnMethodName.Query } });
      await S.send(alice, msgGrant, { want: 202, note: 'an unscoped Messages.Query grant to carol' });
      const bobQuery = await query(S, { author: bob, filter: { protocol: PermissionsProtocol.uri } });
      await S.query(alice, bobQuery.message, { want: 200, note: 'bob queries the permissions protocol: his grant (and his request)' });
      const aliceQuery = await query(S, { author: alice, filter: { protocol: PermissionsProtocol.uri } });
      await S.query(alice, aliceQuery.message, { want: 200, note: 'alice sees every permission record' });
      const useIt = await note(S, bob, { permissionGrantId: g.id });
      await S.send(alice, useIt, { want: 202, note: 'bob uses the grant' });
      const delGrant = await del(S, { author: alice, recordId: g.id });
      await S.process(alice, delGrant.message, { want: 202, note: 'alice deletes the grant record' });
      const afterDelete = await note(S, bob, { permissionGrantId: g.id });
      await S.send(alice, afterDelete, { want: 401, note: 'a deleted grant no longer authorizes' });
    },
  },

  {
    name        : 'permissions-protocols-grants',
    description : 'Protocols.Configure and Protocols.Query grants: configuring and seeing unpublished protocols in someone else\'s DWN.',
    tags        : ['permissions', 'protocols'],
    async build(S) {
      const alice = await S.persona('alice', 'key');
      const bob = await S.persona('bob', 'jwk');
      await setup(S, alice, NOTES);
      const cfgGrant = await grant(S, { grantor: alice, grantee: bob, scope: { interface: DwnInterfaceName.Protocols, method: DwnMethodName.Configure, protocol: DIARY.protocol } });
      await S.send(alice, cfgGrant, { want: 202, note: 'bob may configure the diary protocol' });
      const ok = await configure(S, { author: bob, definition: DIARY, permissionGrantId: cfgGrant.id });
      await S.process(alice, ok.message, { want: 202, note: 'bob configures diary in alice\'s DWN' });
      const other = await configure(S, { author: bob, definition: INBOX, permissionGrantId: cfgGrant.id });
      await S.process(alice, other.message, { want: 401, note: 'bob configures another protocol with it' });
      const none = await configure(S, { author: bob, definition: INBOX });
      await S.process(alice, none.message, { want: 401, note: 'without a grant' });
      const anyGrant = await grant(S, { grantor: alice, grantee: bob, scope: { interface: DwnInterfaceName.Protocols, method: DwnMethodName.Configure } });
      await S.send(alice, anyGrant, { want: 202, note: 'an unscoped configure grant' });
      const any = await configure(S, { author: bob, definition: INBOX, permissionGrantId: anyGrant.id });
      await S.process(alice, any.message, { want: 202, note: 'bob configures inbox with it' });
      const entry = await note(S, alice, { protocol: DIARY, path: 'entry' });
      await S.send(alice, entry, { want: 202, note: 'alice uses the protocol bob configured' });
      const qNoGrant = await protocolsQuery(S, { author: bob });
      await S.query(alice, qNoGrant.message, { want: 200, note: 'bob queries protocols: published only' });
      const qGrant = await grant(S, { grantor: alice, grantee: bob, scope: { interface: DwnInterfaceName.Protocols, method: DwnMethodName.Query } });
      await S.send(alice, qGrant, { want: 202, note: 'protocols query grant' });
      const qWith = await protocolsQuery(S, { author: bob, permissionGrantId: qGrant.id });
      await S.query(alice, qWith.message, { want: 200, note: 'bob queries with the grant: everything' });
      const qWrong = await protocolsQuery(S, { author: bob, permissionGrantId: cfgGrant.id });
      await S.query(alice, qWrong.message, { want: 401, note: 'bob queries invoking a configure grant' });
      const scopedQ = await grant(S, { grantor: alice, grantee: bob, scope: { interface: DwnInterfaceName.Protocols, method: DwnMethodName.Query, protocol: NOTES.protocol } });
      await S.send(alice, scopedQ, { want: 202, note: 'protocols query grant for notes only' });
      const qScoped = await protocolsQuery(S, { author: bob, filter: { protocol: NOTES.protocol }, permissionGrantId: scopedQ.id });
      await S.query(alice, qScoped.message, { want: 200, note: 'bob queries notes with it' });
      const qScopedOther = await protocolsQuery(S, { author: bob, filter: { protocol: DIARY.protocol }, permissionGrantId: scopedQ.id });
      await S.query(alice, qScopedOther.message, { want: 200, note: 'bob queries diary with it: falls back to published only' });
      const rev = await revoke(S, { grantor: alice, grantRecord: qGrant });
      await S.send(alice, rev, { want: 202, note: 'alice revokes the query grant' });
      const qAfter = await protocolsQuery(S, { author: bob, permissionGrantId: qGrant.id });
      await S.query(alice, qAfter.message, { want: 401, note: 'bob queries with the revoked grant' });
    },
  },

  {
    name        : 'permissions-delegated-grants',
    description : 'Delegated grants: a device signs on behalf of its owner (the grantor), within scope, while active and unrevoked.',
    tags        : ['permissions', 'delegation', 'authorization'],
    async build(S) {
      const alice = await S.persona('alice', 'key');
      const bob = await S.persona('bob', 'jwk');
      const phone = await S.persona('alice-phone', 'jwk');
      const carol = await S.persona('carol', 'key');
      await setup(S, alice, NOTES);
      await setup(S, bob, INBOX);
      const writeGrant = await grant(S, { grantor: alice, grantee: phone, delegated: true, scope: recordsScope(DwnMethodName.Write, INBOX.protocol), seconds: 3600 });
      const letter = await write(S, {
        signer         : phone.signer,
        delegatedGrant : writeGrant.dataEncodedMessage,
        data           : bytes('a letter from alice, signed by her phone'),
        protocol       : INBOX.protocol,
        protocolPath   : 'letter',
      });
      await S.send(bob, letter, { want: 202, note: 'the phone writes into bob\'s inbox as alice' });
      const readBack = await read(S, { author: bob, filter: { recordId: letter.recordId } });
      await S.process(bob, readBack.message, { want: 200, note: 'bob reads the letter' });
      const q = await query(S, { author: bob, filter: { protocol: INBOX.protocol, author: alice.did } });
      await S.query(bob, q.message, { want: 200, note: 'the letter\'s author is alice' });

      const notDelegated = await grant(S, { grantor: alice, grantee: phone, delegated: false, scope: recordsScope(DwnMethodName.Write, INBOX.protocol) });
      const viaPlain = await write(S, { signer: phone.signer, delegatedGrant: notDelegated.dataEncodedMessage, data: bytes('x'), protocol: INBOX.protocol, protocolPath: 'letter' });
      await S.send(bob, viaPlain, { want: 400, note: 'invoking a grant that is not delegated' });
      const otherProto = await grant(S, { grantor: alice, grantee: phone, delegated: true, scope: recordsScope(DwnMethodName.Write, NOTES.protocol) });
      const viaOther = await write(S, { signer: phone.signer, delegatedGrant: otherProto.dataEncodedMessage, data: bytes('y'), protocol: INBOX.protocol, protocolPath: 'letter' });
      await S.send(bob, viaOther, { want: 401, note: 'delegated grant scoped to another protocol' });
      const byCarol = await write(S, { signer: carol.signer, delegatedGrant: writeGrant.dataEncodedMessage, data: bytes('z'), protocol: INBOX.protocol, protocolPath: 'letter' });
      await S.send(bob, byCarol, { want: 400, note: 'carol signs with the phone\'s delegated grant (signer is not the grantee)' });
      const readGrant = await grant(S, { grantor: alice, grantee: phone, delegated: true, scope: recordsScope(DwnMethodName.Read, INBOX.protocol) });
      const viaReadGrant = await write(S, { signer: phone.signer, delegatedGrant: readGrant.dataEncodedMessage, data: bytes('r'), protocol: INBOX.protocol, protocolPath: 'letter' });
      await S.send(bob, viaReadGrant, { want: 401, note: 'a delegated read grant used to write' });
      const tampered = JSON.parse(JSON.stringify(letter.message));
      tampered.authorization.authorDelegatedGrant.descriptor.dataFormat = 'text/plain';
      await S.process(bob, tampered, { data: letter.data, want: 400, note: 'delegated grant descriptor changed after signing (its CID no longer matches)' });
      const expired = await write(S, {
        signer         : phone.signer,
        delegatedGrant : writeGrant.dataEncodedMessage,
        data           : bytes('late letter'),
        protocol       : INBOX.protocol,
        protocolPath   : 'letter',
        timestamp      : Time.createOffsetTimestamp({ seconds: 3600 }, writeGrant.message.descriptor.messageTimestamp),
      });
      await S.send(bob, expired, { want: 401, note: 'message stamped at the delegated grant\'s expiry' });

      // in alice's own DWN: the phone acts as the tenant
      await setup(S, alice, INBOX);
      const ownNotesGrant = await grant(S, { grantor: alice, grantee: phone, delegated: true, scope: recordsScope(DwnMethodName.Write, NOTES.protocol) });
      const ownNote = await write(S, { signer: phone.signer, delegatedGrant: ownNotesGrant.dataEncodedMessage, data: bytes('note from phone'), dataFormat: 'text/plain', protocol: NOTES.protocol, protocolPath: 'note' });
      await S.send(alice, ownNote, { want: 202, note: 'the phone writes a note in alice\'s DWN as alice' });
      const readDelegated = await grant(S, { grantor: alice, grantee: phone, delegated: true, scope: recordsScope(DwnMethodName.Read, NOTES.protocol) });
      const phoneRead = await read(S, { signer: phone.signer, delegatedGrant: readDelegated.dataEncodedMessage, filter: { recordId: ownNote.recordId } });
      await S.process(alice, phoneRead.message, { want: 200, note: 'the phone reads it as alice' });
      const queryDelegated = await grant(S, { grantor: alice, grantee: phone, delegated: true, scope: recordsScope(DwnMethodName.Query, NOTES.protocol) });
      const phoneQuery = await query(S, { signer: phone.signer, delegatedGrant: queryDelegated.dataEncodedMessage, filter: { protocol: NOTES.protocol } });
      await S.query(alice, phoneQuery.message, { want: 200, note: 'the phone queries notes as alice' });
      const phoneQueryOther = await query(S, { signer: phone.signer, delegatedGrant: queryDelegated.dataEncodedMessage, filter: { protocol: INBOX.protocol } });
      await S.query(alice, phoneQueryOther.message, { want: 401, note: 'query outside the delegated protocol' });
      const deleteDelegated = await grant(S, { grantor: alice, grantee: phone, delegated: true, scope: recordsScope(DwnMethodName.Delete, NOTES.protocol) });
      const phoneDelete = await del(S, { signer: phone.signer, delegatedGrant: deleteDelegated.dataEncodedMessage, recordId: ownNote.recordId });
      await S.process(alice, phoneDelete.message, { want: 202, note: 'the phone deletes the note as alice' });
      const cfgDelegated = await grant(S, { grantor: alice, grantee: phone, delegated: true, scope: { interface: DwnInterfaceName.Protocols, method: DwnMethodName.Configure } });
      const phoneCfg = await configure(S, { signer: phone.signer, delegatedGrant: cfgDelegated.dataEncodedMessage, definition: DIARY });
      await S.process(alice, phoneCfg.message, { want: 202, note: 'the phone configures a protocol as alice' });

      // revocation of a delegated grant lives in the grantor's DWN
      await S.send(alice, writeGrant, { want: 202, note: 'alice stores the delegated inbox grant' });
      const rev = await revoke(S, { grantor: alice, grantRecord: writeGrant });
      await S.send(alice, rev, { want: 202, note: 'alice revokes it in her DWN' });
      const afterRevToBob = await write(S, { signer: phone.signer, delegatedGrant: writeGrant.dataEncodedMessage, data: bytes('after revocation'), protocol: INBOX.protocol, protocolPath: 'letter' });
      await S.send(bob, afterRevToBob, { want: 401, note: 'sent to bob: revocation is looked up under the grantor (alice), whom this node also hosts' });
      await S.send(alice, afterRevToBob, { want: 401, note: 'alice\'s DWN holds it: refused' });
    },
  },

  {
    name        : 'reference-quirk-delegated-grant-data',
    description : 'Documents a questionable reference behaviour: the encodedData of an embedded delegated grant is not checked against its dataCid, so a swapped (wider) scope is accepted.',
    tags        : ['permissions', 'delegation', 'quirk'],
    async build(S) {
      const alice = await S.persona('alice', 'key');
      const bob = await S.persona('bob', 'jwk');
      const phone = await S.persona('alice-phone', 'jwk');
      await setup(S, bob, INBOX);
      const narrow = await grant(S, { grantor: alice, grantee: phone, delegated: true, scope: recordsScope(DwnMethodName.Write, NOTES.protocol) });
      const letter = await write(S, { signer: phone.signer, delegatedGrant: narrow.dataEncodedMessage, data: bytes('letter'), protocol: INBOX.protocol, protocolPath: 'letter' });
      await S.send(bob, letter, { want: 401, note: 'the grant as issued is scoped to notes: refused for the inbox' });
      const widened = JSON.parse(JSON.stringify(narrow.dataEncodedMessage));
      widened.encodedData = Encoder.stringToBase64Url(JSON.stringify({
        dateExpires : narrow.permissionGrant.dateExpires,
        delegated   : true,
        scope       : recordsScope(DwnMethodName.Write, INBOX.protocol),
      }));
      const swapped = await write(S, { signer: phone.signer, delegatedGrant: widened, data: bytes('letter'), protocol: INBOX.protocol, protocolPath: 'letter' });
      await S.send(bob, swapped, { want: 202, note: 'QUIRK: the same grant message with its data swapped for an inbox scope is accepted (the grant CID excludes encodedData and the data is not checked against dataCid)' });
    },
  },
];


