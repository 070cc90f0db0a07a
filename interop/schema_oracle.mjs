// Schema oracle for p2psync's differential tests.
//
// Asks the reference DWN (dwn-sdk-js) for its JSON-schema verdict so that our Python
// validator (p2psync/dwn/schemas.py) can be compared with it input by input.
//
//   node schema_oracle.mjs validate   < requests.jsonl > verdicts.jsonl
//     each input line:  {"schema": "<name>", "payload": <any JSON value>}
//     each output line: {"code": null} when valid, otherwise
//                       {"code": "<DwnErrorCode>", "detail": "...", "keyword": "...",
//                        "instancePath": "...", "schemaPath": "..."}
//
//   node schema_oracle.mjs corpus     > corpus.jsonl
//     prints valid objects authored with the reference's own message builders, one per
//     line as {"schema": "<name>", "payload": ...}; keys and timestamps are fresh each run.
//
// Run it with interop/ as the working directory (or anywhere: imports are file-relative).

import readline from 'node:readline';

const SDK = './node_modules/@tbd54566975/dwn-sdk-js/dist/esm';
const { validateJsonSchema } = await import(`${SDK}/src/schema-validator.js`);
const validators = await import(`${SDK}/generated/precompiled-validators.js`);

function verdict(schema, payload) {
  try {
    validateJsonSchema(schema, payload);
    return { code: null };
  } catch (e) {
    const out = { code: e.code ?? 'NotADwnError', detail: String(e.message) };
    // The raw first AJV error helps to explain a disagreement; it does not decide it.
    const fn = validators[schema];
    if (fn && fn.errors && fn.errors.length > 0) {
      out.keyword = fn.errors[0].keyword;
      out.instancePath = fn.errors[0].instancePath;
      out.schemaPath = fn.errors[0].schemaPath;
    }
    return out;
  }
}

async function runValidate() {
  const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
  const out = [];
  for await (const line of rl) {
    if (line.trim() === '') continue;
    const req = JSON.parse(line);
    out.push(JSON.stringify(verdict(req.schema, req.payload)));
    if (out.length >= 512) {
      process.stdout.write(out.join('\n') + '\n');
      out.length = 0;
    }
  }
  if (out.length > 0) process.stdout.write(out.join('\n') + '\n');
}

function decodePayload(jws) {
  return JSON.parse(Buffer.from(jws.payload, 'base64url').toString('utf8'));
}

function plain(value) {
  // Drop `undefined` members the builders leave behind, exactly as a JSON wire would.
  return JSON.parse(JSON.stringify(value));
}

async function runCorpus() {
  const sdk = await import(`${SDK}/src/index.js`);
  const {
    TestDataGenerator: Gen, Jws, RecordsRead, RecordsDelete, RecordsQuery, RecordsWrite,
    MessagesRead, PermissionsProtocol, Time, Encoder,
  } = sdk;
  const items = [];
  const emit = (schema, payload) => items.push({ schema, payload: plain(payload) });

  const alice = await Gen.generatePersona();
  const bob = await Gen.generatePersona();
  const signer = Jws.createSigner(alice);

  // --- RecordsWrite in its common shapes -------------------------------------------
  const plainWrite = await Gen.generateRecordsWrite({ author: alice });
  emit('RecordsWrite', plainWrite.message);
  emit('RecordsWriteUnidentified', plainWrite.message);
  emit('RecordsWriteDataEncoded', {
    ...plainWrite.message, encodedData: Encoder.bytesToBase64Url(plainWrite.dataBytes),
  });
  emit('RecordsWriteSignaturePayload', decodePayload(plainWrite.message.authorization.signature));
  emit('GeneralJws', plainWrite.message.authorization.signature);
  emit('Authorization', { signature: plainWrite.message.authorization.signature });
  emit('AuthorizationOwner', plainWrite.message.authorization);
  emit('PublicJwk', alice.keyPair.publicJwk);
  emit('GeneralJwk', alice.keyPair.publicJwk);
  emit('GeneralJwk', alice.keyPair.privateJwk);
  emit('JwkVerificationMethod', {
    id: alice.keyId, type: 'JsonWebKey2020', controller: alice.did,
    publicKeyJwk: alice.keyPair.publicJwk,
  });

  const tagged = await Gen.generateRecordsWrite({
    author: alice,
    tags: { str: 'a', num: 3, flag: true, strs: ['x', 'y'], nums: [1, 2.5] },
    published: true,
    recipient: bob.did,
  });
  emit('RecordsWrite', tagged.message);
  const unpublished = await Gen.generateRecordsWrite({ author: alice, published: false });
  emit('RecordsWrite', unpublished.message);
  const protocolWrite = await Gen.generateRecordsWrite({
    author: alice, protocol: 'http://example.com/proto', protocolPath: 'thread',
    schema: 'http://example.com/thread', dataFormat: 'text/plain',
  });
  emit('RecordsWrite', protocolWrite.message);
  const childWrite = await Gen.generateRecordsWrite({
    author: alice, protocol: 'http://example.com/proto', protocolPath: 'thread/reply',
    parentContextId: protocolWrite.message.contextId,
  });
  emit('RecordsWrite', childWrite.message);
  const attested = await Gen.generateRecordsWrite({ author: alice, attesters: [bob] });
  emit('RecordsWrite', attested.message);
  const update = await RecordsWrite.createFrom({
    recordsWriteMessage: plainWrite.message, data: new TextEncoder().encode('changed'), signer,
  });
  emit('RecordsWrite', update.message);
  const sizedOnly = await Gen.generateRecordsWrite({
    author: alice, dataCid: await Gen.randomCborSha256Cid(), dataSize: 123456,
  });
  emit('RecordsWrite', sizedOnly.message);

  const encrypted = await Gen.generateRecordsWrite({
    author: alice, protocol: 'http://example.com/proto', protocolPath: 'thread',
    encryptionInput: {
      initializationVector: Gen.randomBytes(16),
      key: Gen.randomBytes(32),
      keyEncryptionInputs: [{
        derivationScheme: 'protocolPath',
        publicKeyId: alice.keyId,
        publicKey: alice.keyPair.publicJwk,
      }, {
        derivationScheme: 'protocolContext',
        publicKeyId: bob.keyId,
        publicKey: bob.keyPair.publicJwk,
      }],
    },
  });
  emit('RecordsWrite', encrypted.message);

  // --- permissions: grants, requests, revocations ----------------------------------
  const grant = await PermissionsProtocol.createGrant({
    signer, grantedTo: bob.did, dateExpires: Time.createOffsetTimestamp({ seconds: 100 }),
    scope: { interface: 'Records', method: 'Write', protocol: 'http://example.com/proto' },
    delegated: true, description: 'delegate writes', conditions: { publication: 'Required' },
  });
  emit('RecordsWrite', grant.recordsWrite.message);
  emit('RecordsWriteDataEncoded', grant.dataEncodedMessage);
  emit('AuthorizationDelegatedGrant', {
    signature: plainWrite.message.authorization.signature,
    authorDelegatedGrant: grant.dataEncodedMessage,
  });
  emit('PermissionGrantData', grant.permissionGrantData);
  const scopes = [
    { interface: 'Messages', method: 'Query' },
    { interface: 'Messages', method: 'Read', protocol: 'p' },
    { interface: 'Messages', method: 'Subscribe' },
    { interface: 'Protocols', method: 'Configure' },
    { interface: 'Protocols', method: 'Query', protocol: 'p' },
    { interface: 'Records', method: 'Read', protocol: 'p', protocolPath: 'a/b' },
    { interface: 'Records', method: 'Delete', protocol: 'p', contextId: 'abc' },
    { interface: 'Records', method: 'Query', protocol: 'p' },
    { interface: 'Records', method: 'Subscribe', protocol: 'p' },
  ];
  for (const scope of scopes) {
    emit('PermissionGrantData', {
      dateExpires: Time.getCurrentTimestamp(), scope, delegated: false, requestId: 'r1',
    });
    emit('PermissionRequestData', { delegated: true, scope, description: 'please' });
  }
  const request = await PermissionsProtocol.createRequest({
    signer, delegated: false,
    scope: { interface: 'Records', method: 'Read', protocol: 'http://example.com/proto' },
    conditions: { publication: 'Prohibited' },
  });
  emit('PermissionRequestData', request.permissionRequestData);
  emit('RecordsWrite', request.recordsWrite.message);
  emit('PermissionRevocationData', { description: 'no longer' });
  emit('PermissionRevocationData', {});

  // A write signed by a delegate carries the grant inside its authorization.
  const delegated = await RecordsWrite.create({
    signer: Jws.createSigner(bob), delegatedGrant: grant.dataEncodedMessage,
    protocol: 'http://example.com/proto', protocolPath: 'thread', schema: 's',
    dataFormat: 'application/json', data: Gen.randomBytes(10),
  });
  emit('RecordsWrite', delegated.message);
  emit('RecordsWriteSignaturePayload', decodePayload(delegated.message.authorization.signature));

  // --- ProtocolsConfigure / ProtocolsQuery -----------------------------------------
  emit('ProtocolsConfigure', (await Gen.generateProtocolsConfigure({ author: alice })).message);
  const richDefinition = {
    protocol: 'http://example.com/chat',
    published: true,
    types: {
      thread: { schema: 'http://example.com/thread', dataFormats: ['application/json'] },
      message: { dataFormats: ['text/plain', 'text/markdown'] },
      participant: {},
      attachment: { schema: 'attachment' },
    },
    structure: {
      participant: { $role: true },
      thread: {
        $encryption: { rootKeyId: alice.keyId, publicKeyJwk: alice.keyPair.publicJwk },
        $actions: [
          { who: 'anyone', can: ['create', 'read'] },
          { who: 'author', of: 'thread', can: ['create', 'update', 'co-delete', 'prune'] },
          { role: 'participant', can: ['read', 'query', 'subscribe'] },
        ],
        $size: { min: 0, max: 1000 },
        $tags: {
          $requiredTags: ['topic'],
          $allowUndefinedTags: false,
          topic: { type: 'string', enum: ['a', 'b'], maxLength: 10 },
          priority: { type: 'integer', minimum: 0, maximum: 5 },
          labels: {
            type: 'array', minItems: 1, maxItems: 3, uniqueItems: true,
            items: { type: 'string', maxLength: 20 },
            contains: { type: 'string', enum: ['x'] },
          },
          score: { type: 'number', exclusiveMinimum: 0 },
          done: { type: 'boolean' },
        },
        message: {
          $actions: [{ who: 'recipient', of: 'thread', can: ['create'] }],
          attachment: { $size: { max: 10 } },
        },
      },
    },
  };
  const rich = await Gen.generateProtocolsConfigure({
    author: alice, protocolDefinition: richDefinition,
  });
  emit('ProtocolsConfigure', rich.message);
  emit('ProtocolDefinition', richDefinition);
  emit('ProtocolRuleSet', richDefinition.structure.thread);
  emit('GenericSignaturePayload', decodePayload(rich.message.authorization.signature));
  emit('ProtocolsQuery', (await Gen.generateProtocolsQuery({ author: alice })).message);
  emit('ProtocolsQuery', (await Gen.generateProtocolsQuery({
    author: alice, filter: { protocol: 'http://example.com/chat' },
  })).message);
  emit('ProtocolsQuery', (await Gen.generateProtocolsQuery({
    author: alice, filter: { protocol: 'p', recipient: bob.did },
  })).message);

  // --- Records queries, reads, subscriptions, deletes ------------------------------
  const filters = [
    { schema: 'http://example.com/thread' },
    { protocol: 'p', protocolPath: 'a/b', contextId: 'c1' },
    { author: alice.did },
    { author: [alice.did, bob.did], recipient: [bob.did] },
    { recipient: bob.did, attester: alice.did },
    { tags: { a: 'x', b: 2, c: true, d: { startsWith: 'pre' } } },
    { tags: { e: { gte: 'a', lt: 'm' }, f: { gt: 1, lte: 9 } } },
    { published: true, datePublished: { from: Time.getCurrentTimestamp() } },
    { dateCreated: { from: Time.getCurrentTimestamp(), to: Time.getCurrentTimestamp() } },
    { dateUpdated: { to: Time.getCurrentTimestamp() } },
    { dataSize: { gte: 10 } },
    { dataFormat: 'application/json', dataCid: 'bafy', parentId: 'x', recordId: 'y' },
    { published: false },
  ];
  for (const filter of filters) {
    emit('RecordsFilter', filter);
    emit('RecordsQuery', (await Gen.generateRecordsQuery({ author: alice, filter })).message);
    emit('RecordsSubscribe', (await Gen.generateRecordsSubscribe({ author: alice, filter })).message);
  }
  const paged = await RecordsQuery.create({
    signer, filter: { schema: 's' }, dateSort: 'publishedDescending',
    pagination: { limit: 10, cursor: { messageCid: 'bafyabc', value: 3 } },
  });
  emit('RecordsQuery', paged.message);
  emit('PaginationCursor', { messageCid: 'bafyabc', value: 'str' });
  emit('StringRangeFilter', { gt: 'a', lte: 'z' });
  emit('NumberRangeFilter', { gte: 1, lt: 2 });
  const anonymousQuery = await RecordsQuery.create({ filter: { schema: 's' } });
  emit('RecordsQuery', anonymousQuery.message);

  const read = await RecordsRead.create({ filter: { recordId: plainWrite.message.recordId }, signer });
  emit('RecordsRead', read.message);
  const anonymousRead = await RecordsRead.create({ filter: { protocol: 'p', protocolPath: 'x' } });
  emit('RecordsRead', anonymousRead.message);
  const del = await RecordsDelete.create({ recordId: plainWrite.message.recordId, signer });
  emit('RecordsDelete', del.message);
  const prune = await RecordsDelete.create({
    recordId: plainWrite.message.recordId, signer, prune: true, protocolRole: 'participant',
  });
  emit('RecordsDelete', prune.message);
  emit('GenericSignaturePayload', decodePayload(prune.message.authorization.signature));

  // --- Messages interface ----------------------------------------------------------
  const messageFilters = [
    [],
    [{ interface: 'Records' }],
    [{ interface: 'Protocols', method: 'Configure', protocol: 'p' }],
    [{ messageTimestamp: { from: Time.getCurrentTimestamp() } }, { method: 'Delete' }],
  ];
  for (const mf of messageFilters) {
    emit('MessagesQuery', (await Gen.generateMessagesQuery({ author: alice, filters: mf })).message);
    emit('MessagesSubscribe',
      (await Gen.generateMessagesSubscribe({ author: alice, filters: mf })).message);
    for (const one of mf) emit('MessagesFilter', one);
  }
  emit('MessagesQuery', (await Gen.generateMessagesQuery({
    author: alice, cursor: { messageCid: 'bafyx', value: 'v' },
  })).message);
  const mread = await MessagesRead.create({
    signer, messageCid: await Gen.randomCborSha256Cid(),
  });
  emit('MessagesRead', mread.message);

  // --- containers whose schema only asks for an object -----------------------------
  emit('Definitions', {});
  emit('PermissionsDefinitions', { anything: 1 });
  emit('PermissionsScopes', {});

  process.stdout.write(items.map((i) => JSON.stringify(i)).join('\n') + '\n');
}

const mode = process.argv[2] ?? 'validate';
if (mode === 'validate') {
  await runValidate();
} else if (mode === 'corpus') {
  await runCorpus();
  // Level and key libraries may keep handles open; the corpus is written, so leave now.
  process.exit(0);
} else {
  process.stderr.write(`unknown mode ${mode}; use "validate" or "corpus"\n`);
  process.exit(2);
}
