// The scenario files' compact data spec: {"dataGen": {"size": N, "seed": S}} stands for the
// first N bytes of SHA-256(`${S}:0`) || SHA-256(`${S}:1`) || SHA-256(`${S}:2`) || ...
// where S and the block counter are written in decimal ASCII. The Python runner
// (p2psync/conformance/scenario.py, expand_data_gen) implements the same function.

import { createHash } from 'node:crypto';

const BLOCK = 32; // bytes of one SHA-256 digest

/** Expands a dataGen spec into its bytes. */
export function expandDataGen({ size, seed }) {
  if (!Number.isSafeInteger(size) || size < 0 || !Number.isSafeInteger(seed) || seed < 0) {
    throw new Error(`invalid dataGen spec: ${JSON.stringify({ size, seed })}`);
  }
  const out = Buffer.alloc(size);
  const blocks = Math.ceil(size / BLOCK);
  for (let i = 0; i < blocks; i++) {
    const digest = createHash('sha256').update(`${seed}:${i}`, 'ascii').digest();
    digest.copy(out, i * BLOCK, 0, Math.min(BLOCK, size - i * BLOCK));
  }
  return new Uint8Array(out.buffer, out.byteOffset, out.length);
}
