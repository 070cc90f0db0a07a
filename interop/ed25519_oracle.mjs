// The reference DWN's Ed25519 verdicts, for the differential tests of p2psync/dwn/ed25519.py.
// Run with cwd = interop/. One JSON request per stdin line, one JSON answer per stdout line.
//
//   node ed25519_oracle.mjs raw   {"pub": hex, "sig": hex, "msg": hex}
//       through the DWN's own signing-algorithm wrapper (signatureAlgorithms.Ed25519.verify,
//       which calls @noble/ed25519 verifyAsync(signature, content, publicKey)):
//       {"outcome": "accept" | "refuse" | "throw", "error": message of a throw}
//   node ed25519_oracle.mjs jws   {"jws": {"payload": ..., "signatures": [...]}}
//       through GeneralJwsVerifier.verifySignatures with the harness's offline did:key/did:jwk
//       resolver: {"outcome": "accept" | "throw", "code": DwnError code, "error": message}
//   node ed25519_oracle.mjs didkey {"pub": hex}
//       whether the reference resolves did:key for these key bytes: {"resolves": bool}

import { createInterface } from 'node:readline';
import { DidJwk, DidKey, DidResolverCacheNoop, UniversalResolver } from '@web5/dids';

function sdkModule(path) {
  // Deep modules by file URL: the package's "exports" map hides them.
  return import(new URL(`./node_modules/@tbd54566975/dwn-sdk-js/dist/esm/src/${path}.js`, import.meta.url));
}

const mode = process.argv[2];
const { signatureAlgorithms } = await sdkModule('jose/algorithms/signing/signature-algorithms');
const { GeneralJwsVerifier } = await sdkModule('jose/jws/general/verifier');
const { Encoder } = await sdkModule('utils/encoder');
const resolver = new UniversalResolver({ didResolvers: [DidKey, DidJwk], cache: DidResolverCacheNoop });
const hex = (text) => Uint8Array.from(Buffer.from(text, 'hex'));

function didKeyOf(pub) {
  // did:key = "z" + base58btc(0xed 0x01 ‖ key), built by the same resolver package.
  const bytes = new Uint8Array([0xed, 0x01, ...pub]);
  const alphabet = '123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz';
  let n = BigInt('0x' + Buffer.from(bytes).toString('hex'));
  let out = '';
  while (n > 0n) { out = alphabet[Number(n % 58n)] + out; n /= 58n; }
  return `did:key:z${out}`;
}

async function answer(request) {
  if (mode === 'raw') {
    const jwk = { kty: 'OKP', crv: 'Ed25519', x: Encoder.bytesToBase64Url(hex(request.pub)) };
    try {
      const ok = await signatureAlgorithms.Ed25519.verify(hex(request.msg), hex(request.sig), jwk);
      return { outcome: ok ? 'accept' : 'refuse' };
    } catch (err) {
      return { outcome: 'throw', error: String(err?.message ?? err) };
    }
  }
  if (mode === 'jws') {
    try {
      await GeneralJwsVerifier.verifySignatures(request.jws, resolver);
      return { outcome: 'accept' };
    } catch (err) {
      return { outcome: 'throw', code: err?.code ?? null, error: String(err?.message ?? err) };
    }
  }
  if (mode === 'didkey') {
    const { didDocument } = await resolver.resolve(didKeyOf(hex(request.pub)));
    return { resolves: Boolean(didDocument?.verificationMethod?.length) };
  }
  throw new Error(`unknown mode ${mode}`);
}

for await (const line of createInterface({ input: process.stdin, crlfDelay: Infinity })) {
  if (line.trim()) {
    process.stdout.write(JSON.stringify(await answer(JSON.parse(line))) + '\n');
  }
}
