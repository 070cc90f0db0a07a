// Deterministic test identities for the scenarios.
//
// A persona's Ed25519 key is derived from its name, so regenerating the scenarios gives the
// same DIDs (and, Ed25519 being deterministic, the same signatures). The DIDs are still made
// by the DID library's own `DidKey.create()` / `DidJwk.create()`: we only hand them a key
// manager whose "new" key is the seeded one. These keys protect nothing; never reuse them.

import { createHash } from 'node:crypto';

import { Ed25519, LocalKeyManager } from '@web5/crypto';
import { DidJwk, DidKey } from '@web5/dids';
import { PrivateKeySigner } from '@tbd54566975/dwn-sdk-js';

const SEED_DOMAIN = 'p2psync-interop-persona/v1:';

/** A key manager that "generates" one fixed key: the seeded one. */
class SeededKeyManager extends LocalKeyManager {
  constructor(privateJwk) {
    super();
    this.seededKey = privateJwk;
  }

  async generateKey() {
    return this.importKey({ key: { ...this.seededKey } });
  }
}

/**
 * Creates the persona `name` with a did:key or did:jwk (Ed25519) DID.
 * Returns { name, method, did, keyId, signer }.
 */
export async function createPersona(name, method = 'key') {
  const seed = createHash('sha256').update(SEED_DOMAIN + name, 'utf8').digest();
  const privateJwk = await Ed25519.bytesToPrivateKey({ privateKeyBytes: new Uint8Array(seed) });
  const keyManager = new SeededKeyManager(privateJwk);

  let did;
  if (method === 'key') {
    did = await DidKey.create({ keyManager });
  } else if (method === 'jwk') {
    did = await DidJwk.create({ keyManager });
  } else {
    throw new Error(`unknown DID method for persona ${name}: ${method}`);
  }

  const signingMethod = method === 'key'
    ? await DidKey.getSigningMethod({ didDocument: did.document })
    : await DidJwk.getSigningMethod({ didDocument: did.document });
  const portable = await did.export();
  const signer = new PrivateKeySigner({
    privateJwk : portable.privateKeys[0],
    algorithm  : 'EdDSA',
    keyId      : signingMethod.id,
  });
  return { name, method: `did:${method}`, did: did.uri, keyId: signingMethod.id, signer, privateJwk: portable.privateKeys[0] };
}
