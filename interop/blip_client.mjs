#!/usr/bin/env node
// An independent BLIP_3 client that puts a BLIP echo peer through a list of checks.
//
//   node interop/blip_client.mjs ws://127.0.0.1:PORT/anything [--app-id P2PSync_1] [--trace] [--strict-acks]
//
//   node interop/blip_client.mjs --vectors protocol/blip/vectors.json
//
// --trace prints every frame to stderr; --strict-acks also fails a peer whose ACKs do not follow
// protocol/blip/README.md's schedule exactly (one at each multiple of 50,000, see judgeAcks).
// --vectors decodes the golden frames with this client's codec instead of talking to a peer.
//
// It is written from the BLIP_3 description (Couchbase Mobile replication protocol, section 1)
// and the frame rules in protocol/blip/README.md, deliberately without looking at
// p2psync/blip: the point is a second implementation, in another language, that can disagree.
// Only `ws` (WebSocket framing) and node:zlib (raw deflate) are borrowed; varints, the CRC,
// properties, framing, multiplexing and flow control are done here.
//
// The peer is expected to serve the echo profiles: `echo` (body back, `X-Len`, compressed when
// `X-Compress: 1`), `fail` (an ERR), `callme` (a reply, then a `hello` request to us), and
// BLIP 404 for anything else. Output: one `ok NAME` / `FAIL NAME: why` line per check, then
// `N passed, M failed`; exit status 1 when anything failed.

import { createHash } from 'node:crypto';
import process from 'node:process';
import zlib from 'node:zlib';
import { WebSocket } from 'ws';

// ------------------------------------------------------------------------------ wire constants

const TYPE_MASK = 0x07;
const MSG = 0;
const RPY = 1;
const ERR = 2;
const ACKMSG = 4;
const ACKRPY = 5;
const TYPE_NAMES = ['MSG', 'RPY', 'ERR', 'type3', 'ACKMSG', 'ACKRPY', 'type6', 'type7'];
const COMPRESSED = 0x08;
const URGENT = 0x10;
const NOREPLY = 0x20;
const MORECOMING = 0x40;

// Flow control numbers from the BLIP_3 frame rules: the receiver acknowledges every 50,000
// bytes of a message; the sender stops a message with more than 128,000 bytes unacknowledged.
const ACK_INTERVAL = 50_000;
const SEND_WINDOW = 128_000;
// What a zlib sync flush always ends with; BLIP strips it on the wire and the receiver adds it.
const SYNC_TAIL = Buffer.from([0x00, 0x00, 0xff, 0xff]);
// Our own framing: any frame size is legal; these keep messages multi-frame at test sizes.
const BIG_CHUNK = 16_000;
const SMALL_CHUNK = 4_000;
// A whole check gets this long before it is reported as hung.
const CHECK_TIMEOUT_MS = 20_000;
// How long the peer's stream must stay silent before we call a withheld-ACK transfer paused.
const QUIET_MS = 400;

// ------------------------------------------------------------------------------ small codecs

/** Unsigned LEB128 of a non-negative safe integer. */
function uvarint(value) {
  const out = [];
  let v = value;
  while (v >= 0x80) {
    out.push((v % 0x80) | 0x80);
    v = Math.floor(v / 0x80);
  }
  out.push(v);
  return Buffer.from(out);
}

/** Reads an unsigned LEB128 at `offset`; returns [value, next offset] or throws. */
function readUvarint(buf, offset) {
  let value = 0;
  let scale = 1;
  for (let i = 0; i < 10; i++) {
    if (offset + i >= buf.length) throw new Error('truncated varint');
    const byte = buf[offset + i];
    value += (byte & 0x7f) * scale;
    if ((byte & 0x80) === 0) return [value, offset + i + 1];
    scale *= 0x80;
  }
  throw new Error('varint longer than 10 bytes');
}

// CRC-32 as zlib computes it (reflected polynomial 0xEDB88320); written here because Node 20's
// zlib has no crc32 of its own.
const CRC_TABLE = (() => {
  const table = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    table[n] = c >>> 0;
  }
  return table;
})();

/** Continues a CRC-32 `crc` over `data` (start from 0), like zlib's crc32(data, crc). */
function crc32(crc, data) {
  let c = (crc ^ 0xffffffff) >>> 0;
  for (let i = 0; i < data.length; i++) c = CRC_TABLE[(c ^ data[i]) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

/** Properties block: NUL-terminated UTF-8 key, value, key, value, ... */
function encodeProperties(props) {
  const parts = [];
  for (const [key, value] of Object.entries(props)) {
    parts.push(Buffer.from(`${key}\0${value}\0`, 'utf8'));
  }
  return Buffer.concat(parts);
}

function decodeProperties(block) {
  if (block.length === 0) return {};
  if (block[block.length - 1] !== 0) throw new Error('properties do not end with NUL');
  const strings = new TextDecoder('utf-8', { fatal: true })
    .decode(block.subarray(0, block.length - 1))
    .split('\0');
  if (strings.length % 2 !== 0) throw new Error(`odd number of property strings (${strings.length})`);
  const props = {};
  for (let i = 0; i < strings.length; i += 2) {
    if (Object.hasOwn(props, strings[i])) throw new Error(`duplicate property ${strings[i]}`);
    props[strings[i]] = strings[i + 1];
  }
  return props;
}

/** A message's concatenated frame payload: uvarint(properties length) | properties | body. */
function encodeMessage(props, body) {
  const block = encodeProperties(props);
  return Buffer.concat([uvarint(block.length), block, body]);
}

function decodeMessage(payload) {
  const [length, start] = readUvarint(payload, 0);
  if (start + length > payload.length) throw new Error('properties longer than the message');
  return {
    props: decodeProperties(payload.subarray(start, start + length)),
    body: payload.subarray(start + length),
  };
}

/** One frame: uvarint(number) | uvarint(flags) | body | CRC (big-endian; none on ACKs). */
function encodeFrame(number, flags, body, crc) {
  const parts = [uvarint(number), uvarint(flags), body];
  if (crc !== undefined) {
    const tail = Buffer.alloc(4);
    tail.writeUInt32BE(crc >>> 0);
    parts.push(tail);
  }
  return Buffer.concat(parts);
}

function flagText(flags) {
  const names = [TYPE_NAMES[flags & TYPE_MASK]];
  if (flags & COMPRESSED) names.push('Compressed');
  if (flags & URGENT) names.push('Urgent');
  if (flags & NOREPLY) names.push('NoReply');
  if (flags & MORECOMING) names.push('MoreComing');
  return names.join('|');
}

/**
 * One direction's raw deflate (or inflate) stream. Each call feeds one frame's bytes and does a
 * sync flush; calls are serialized because the stream state carries over between frames.
 */
class ZStream {
  constructor(inflate) {
    // A huge read buffer so the stream never waits for a reader: we read after each flush.
    const options = { readableHighWaterMark: 1 << 30 };
    this.z = inflate ? zlib.createInflateRaw(options) : zlib.createDeflateRaw({ ...options, level: 6 });
    this.failure = null;
    this.pendingReject = null;
    this.z.on('error', (error) => {
      this.failure = error;
      if (this.pendingReject) this.pendingReject(error);
    });
    this.queue = Promise.resolve();
  }

  run(input) {
    const step = this.queue.then(
      () =>
        new Promise((resolve, reject) => {
          if (this.failure) return reject(this.failure);
          this.pendingReject = reject;
          this.z.write(input);
          this.z.flush(zlib.constants.Z_SYNC_FLUSH, () => {
            this.pendingReject = null;
            if (this.failure) return reject(this.failure);
            resolve(this.z.read() ?? Buffer.alloc(0));
          });
        }),
    );
    this.queue = step.catch(() => {});
    return step;
  }

  close() {
    this.z.destroy();
  }
}

// ------------------------------------------------------------------------------ helpers

/** Deterministic incompressible bytes. */
function noise(length, seed) {
  const chunks = [];
  let block = createHash('sha256').update(`seed:${seed}`).digest();
  let total = 0;
  while (total < length) {
    block = createHash('sha256').update(block).digest();
    chunks.push(block);
    total += block.length;
  }
  return Buffer.concat(chunks).subarray(0, length);
}

/** Deterministic, very compressible text. */
function prose(length) {
  const lines = [];
  let total = 0;
  for (let i = 0; total < length; i++) {
    const line = `line ${i}: the quick brown fox jumps over the lazy dog, again and again.\n`;
    lines.push(line);
    total += line.length;
  }
  return Buffer.from(lines.join(''), 'utf8').subarray(0, length);
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function withTimeout(promise, ms, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms ${what}`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/** Resolves when `predicate()` holds, polling; rejects after `ms`. */
async function waitFor(predicate, ms, what) {
  const deadline = Date.now() + ms;
  while (!predicate()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await sleep(10);
  }
}

function describeBody(body) {
  return `${body.length} B sha256 ${createHash('sha256').update(body).digest('hex').slice(0, 12)}`;
}

// ------------------------------------------------------------------------------ the connection

/** Everything the checks learn across connections, for the aggregate checks at the end. */
const ledger = {
  framesChecked: 0,
  crcFailures: [],
  numbering: [],
  ackProblems: [],
  acksSeen: 0,
  protocol: [],
};

let traceFrames = false;

/**
 * A BLIP_3 connection over `ws`: sends requests (multiplexed round-robin, flow controlled),
 * receives frames (running CRC, per-direction inflate, ACKs), answers `hello` requests.
 */
class BlipConnection {
  constructor(ws, label) {
    this.ws = ws;
    this.label = label;
    this.closed = null; // {code, reason} once closed
    this.closeWaiters = [];

    // Outgoing direction.
    this.nextRequest = 1;
    this.outbox = []; // messages with frames left to send, in round-robin order
    this.outgoing = new Map(); // `${MSG|RPY}:${number}` -> message, kept after completion for ACKs
    this.crcOut = 0;
    this.deflater = new ZStream(false);
    this.pumping = false;
    this.sentFrames = []; // {key, flags} in send order

    // Incoming direction.
    this.crcIn = 0;
    this.inflater = new ZStream(true);
    this.receiving = new Map(); // `${q|r}:${number}` -> message being assembled
    this.lastPeerRequest = 0;
    this.pending = new Map(); // our request number -> {resolve, reject, record}
    this.withheldAcks = new Set(); // request numbers whose replies we deliberately do not ACK
    this.replyRecords = new Map(); // request number -> live record of the reply (for checks)
    this.peerRequests = []; // completed incoming requests
    this.rxChain = Promise.resolve();
    this.acksIn = []; // {type, number, value, flags}
    this.rxFrames = []; // {key, flags, size} in arrival order

    ws.on('message', (data, isBinary) => {
      const frame = Buffer.isBuffer(data) ? data : Buffer.concat(data);
      if (!isBinary) {
        this.problem(`peer sent a text WebSocket message (${frame.length} B)`);
        return;
      }
      // Frames are handled strictly in order: inflate and CRC state carry over.
      this.rxChain = this.rxChain.then(() => this.onFrame(frame)).catch((error) => {
        this.problem(`frame handling failed: ${error.message}`);
      });
    });
    ws.on('close', (code, reason) => {
      this.closed = { code, reason: reason.toString() };
      for (const { reject } of this.pending.values()) {
        reject(new Error(`connection closed (${code} ${this.closed.reason}) before the reply`));
      }
      this.pending.clear();
      for (const waiter of this.closeWaiters) waiter(this.closed);
      this.deflater.close();
      this.inflater.close();
    });
    ws.on('error', (error) => this.problem(`WebSocket error: ${error.message}`));
  }

  /** Opens a WebSocket to `url` offering `protocols`; resolves to a BlipConnection. */
  static open(url, protocols, { perMessageDeflate = false, label = 'conn' } = {}) {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(url, protocols, { perMessageDeflate, handshakeTimeout: 5000 });
      ws.binaryType = 'nodebuffer';
      ws.once('open', () => resolve(new BlipConnection(ws, label)));
      ws.once('unexpected-response', (_req, res) => {
        reject(new Error(`handshake refused with HTTP ${res.statusCode}`));
        ws.terminate();
      });
      ws.once('error', (error) => reject(error));
    });
  }

  problem(text) {
    ledger.protocol.push(`${this.label}: ${text}`);
  }

  whenClosed() {
    if (this.closed) return Promise.resolve(this.closed);
    return new Promise((resolve) => this.closeWaiters.push(resolve));
  }

  close(code = 1000) {
    if (!this.closed) this.ws.close(code);
    return this.whenClosed();
  }

  // ---------------------------------------------------------------- sending

  /**
   * Queues a request. Returns {number, reply} where `reply` resolves to the whole reply
   * ({type, props, body, record}) or never settles for a NoReply request.
   */
  request(profile, props, body, options = {}) {
    const { compress = false, noReply = false, urgent = false, chunk = BIG_CHUNK } = options;
    const number = this.nextRequest++;
    if (options.withholdAcks) this.withheldAcks.add(number);
    const record = { frames: [], received: 0, ackedSent: 0, acksSent: [], maxUnacked: 0, windowBreaches: [] };
    this.replyRecords.set(number, record);
    const reply = noReply
      ? null
      : new Promise((resolve, reject) => this.pending.set(number, { resolve, reject, record }));
    let flags = MSG;
    if (noReply) flags |= NOREPLY;
    if (urgent) flags |= URGENT;
    const message = this.enqueue(MSG, number, flags, encodeMessage({ Profile: profile, ...props }, body), compress, chunk);
    return { number, reply, message, record };
  }

  enqueue(type, number, flags, payload, compress, chunk) {
    const message = {
      key: `${type === MSG ? 'MSG' : 'RPY'}:${number}`,
      type,
      number,
      flags,
      payload,
      compress,
      chunk,
      offset: 0,
      sent: 0, // flow-control bytes sent: each frame's bytes after its two header varints
      acked: 0,
      cumulative: [], // `sent` after each frame, with whether MoreComing was set
      acks: [], // ACK values received for this message
    };
    this.outgoing.set(message.key, message);
    this.outbox.push(message);
    this.pump();
    return message;
  }

  /** Sends frames round-robin while any message is within its flow-control window. */
  async pump() {
    if (this.pumping) return;
    this.pumping = true;
    try {
      let progressed = true;
      while (progressed && !this.closed) {
        progressed = false;
        for (const message of [...this.outbox]) {
          if (this.closed) break;
          if (message.sent - message.acked > SEND_WINDOW) continue; // paused until an ACK
          await this.sendFrame(message);
          progressed = true;
          if (message.offset >= message.payload.length) {
            this.outbox.splice(this.outbox.indexOf(message), 1);
          }
        }
        // Let incoming frames (ACKs among them) in between rounds.
        if (progressed) await new Promise((resolve) => setImmediate(resolve));
      }
    } finally {
      this.pumping = false;
    }
  }

  async sendFrame(message) {
    const piece = message.payload.subarray(message.offset, message.offset + message.chunk);
    message.offset += piece.length;
    const more = message.offset < message.payload.length;
    let flags = message.flags | (more ? MORECOMING : 0);
    let body = piece;
    // `compress` may be 'alternate': every other frame compressed, as the flag is per frame.
    const compressThis = message.compress === 'alternate' ? message.cumulative.length % 2 === 0 : message.compress;
    if (compressThis) {
      const deflated = await this.deflater.run(piece);
      if (!deflated.subarray(-4).equals(SYNC_TAIL)) throw new Error('deflate sync flush without 00 00 FF FF');
      body = deflated.subarray(0, deflated.length - 4);
      flags |= COMPRESSED;
    }
    // The running CRC is over uncompressed bodies.
    this.crcOut = crc32(this.crcOut, piece);
    const frame = encodeFrame(message.number, flags, body, this.crcOut);
    message.sent += body.length + 4;
    message.cumulative.push({ sent: message.sent, more });
    this.sentFrames.push({ key: message.key, flags });
    if (traceFrames) console.error(`${this.label} -> #${message.number} ${flagText(flags)} ${frame.length} B`);
    this.ws.send(frame);
  }

  /** Sends a prebuilt frame as is (for the checks that break the rules on purpose). */
  sendRaw(frame) {
    this.ws.send(frame);
  }

  sendAck(type, number, value) {
    const frame = encodeFrame(number, type | URGENT | NOREPLY, uvarint(value));
    if (traceFrames) console.error(`${this.label} -> #${number} ${flagText(type | URGENT | NOREPLY)} ${value}`);
    this.ws.send(frame);
  }

  /** Stops withholding ACKs for the reply to request `number`; acknowledges what arrived. */
  releaseAcks(number) {
    this.withheldAcks.delete(number);
    const incoming = this.receiving.get(`r:${number}`);
    if (incoming) {
      incoming.record.ackedSent = incoming.received;
      incoming.record.acksSent.push(incoming.received);
      this.sendAck(ACKRPY, number, incoming.received);
    }
  }

  // ---------------------------------------------------------------- receiving

  async onFrame(frame) {
    let number;
    let flags;
    let offset;
    try {
      [number, offset] = readUvarint(frame, 0);
      [flags, offset] = readUvarint(frame, offset);
    } catch (error) {
      this.problem(`bad frame header (${error.message}): ${frame.subarray(0, 16).toString('hex')}`);
      return;
    }
    const type = flags & TYPE_MASK;
    if (traceFrames) console.error(`${this.label} <- #${number} ${flagText(flags)} ${frame.length} B`);
    if (type === ACKMSG || type === ACKRPY) return this.onAck(type, number, flags, frame.subarray(offset));
    if (type !== MSG && type !== RPY && type !== ERR) {
      this.problem(`frame of undefined type ${type} (#${number}, flags 0x${flags.toString(16)})`);
      return;
    }
    if (frame.length - offset < 4) {
      this.problem(`#${number} ${flagText(flags)}: frame too short for a CRC (${frame.length} B)`);
      return;
    }
    const wireBody = frame.subarray(offset, frame.length - 4);
    const crcWritten = frame.readUInt32BE(frame.length - 4);
    let data = wireBody;
    if (flags & COMPRESSED) {
      try {
        data = await this.inflater.run(Buffer.concat([wireBody, SYNC_TAIL]));
      } catch (error) {
        this.problem(`#${number} ${flagText(flags)}: inflate failed: ${error.message}`);
        return;
      }
    }
    this.crcIn = crc32(this.crcIn, data);
    ledger.framesChecked += 1;
    if (this.crcIn !== crcWritten) {
      ledger.crcFailures.push(
        `${this.label} #${number} ${flagText(flags)} (${frame.length} B, frame ${this.rxFrames.length + 1} received): ` +
          `CRC written 0x${crcWritten.toString(16)}, running CRC 0x${this.crcIn.toString(16)}`,
      );
      this.crcIn = crcWritten; // resynchronise so one bad frame is reported once
    }

    const isRequest = type === MSG;
    const key = `${isRequest ? 'q' : 'r'}:${number}`;
    this.rxFrames.push({ key, flags, size: frame.length - offset });
    let incoming = this.receiving.get(key);
    if (!incoming) {
      if (isRequest) {
        if (number !== this.lastPeerRequest + 1) {
          ledger.numbering.push(`${this.label}: peer request #${number} after #${this.lastPeerRequest}`);
        }
        this.lastPeerRequest = Math.max(this.lastPeerRequest, number);
      } else if (!this.pending.has(number)) {
        ledger.numbering.push(
          `${this.label}: ${flagText(flags)} #${number} answers no request awaiting a reply ` +
            `(we have sent #1..#${this.nextRequest - 1})`,
        );
        return;
      }
      incoming = {
        type,
        number,
        firstFlags: flags,
        parts: [],
        received: 0,
        record: isRequest ? { frames: [], acksSent: [], ackedSent: 0, maxUnacked: 0, windowBreaches: [] } : this.pending.get(number).record,
      };
      this.receiving.set(key, incoming);
    }
    const size = frame.length - offset; // flow-control count: compressed body + CRC
    const before = incoming.received;
    incoming.received += size;
    incoming.parts.push(data);
    const record = incoming.record;
    record.received = incoming.received;
    record.frames.push({ flags, size, plain: data.length, at: Date.now() });
    // The peer may not have more than SEND_WINDOW unacknowledged when it starts a frame, so
    // what we have received beyond our last ACK can exceed the window by one frame at most.
    const unacked = incoming.received - record.ackedSent;
    record.maxUnacked = Math.max(record.maxUnacked, unacked);
    if (unacked > SEND_WINDOW + size) {
      record.windowBreaches.push(`${unacked} B unacknowledged after a ${size} B frame`);
    }

    if (flags & MORECOMING) {
      const crossed = Math.floor(incoming.received / ACK_INTERVAL) > Math.floor(before / ACK_INTERVAL);
      if (crossed && !(type !== MSG && this.withheldAcks.has(number))) {
        record.ackedSent = incoming.received;
        record.acksSent.push(incoming.received);
        this.sendAck(isRequest ? ACKMSG : ACKRPY, number, incoming.received);
      }
      return;
    }

    this.receiving.delete(key);
    let decoded;
    try {
      decoded = decodeMessage(Buffer.concat(incoming.parts));
    } catch (error) {
      this.problem(`${flagText(incoming.firstFlags)} #${number}: malformed message: ${error.message}`);
      if (!isRequest) {
        this.pending.get(number)?.reject(new Error(`malformed reply: ${error.message}`));
        this.pending.delete(number);
      }
      return;
    }
    if (isRequest) {
      this.onRequest({ number, flags: incoming.firstFlags, ...decoded });
    } else {
      const waiter = this.pending.get(number);
      this.pending.delete(number);
      waiter.resolve({ type: incoming.type, number, ...decoded, record });
    }
  }

  onAck(type, number, flags, body) {
    ledger.acksSeen += 1;
    const name = flagText(flags);
    if ((flags & (URGENT | NOREPLY)) !== (URGENT | NOREPLY)) {
      ledger.ackProblems.push(`${this.label} ${name} #${number}: Urgent and NoReply should both be set`);
    }
    let value;
    try {
      let end;
      [value, end] = readUvarint(body, 0);
      if (end !== body.length) throw new Error(`${body.length - end} bytes after the count (a CRC?)`);
    } catch (error) {
      ledger.ackProblems.push(`${this.label} ${name} #${number}: bad body ${body.toString('hex')} (${error.message})`);
      return;
    }
    this.acksIn.push({ type, number, value, flags });
    const message = this.outgoing.get(`${type === ACKMSG ? 'MSG' : 'RPY'}:${number}`);
    if (!message) {
      ledger.ackProblems.push(`${this.label} ${name} #${number} (${value}) for a message we never sent`);
      return;
    }
    message.acks.push(value);
    if (value > message.sent) {
      ledger.ackProblems.push(`${this.label} ${name} #${number} claims ${value} B, we sent ${message.sent}`);
      return;
    }
    message.acked = Math.max(message.acked, value);
    this.pump();
  }

  /** The echo peer's `callme` calls us back with `hello`; anything else gets our own 404. */
  onRequest(request) {
    this.peerRequests.push(request);
    if (request.flags & NOREPLY) return;
    if (request.props.Profile === 'hello') {
      const body = Buffer.from(`hello back to #${request.number}`);
      this.enqueue(RPY, request.number, RPY, encodeMessage({ 'X-Len': String(request.body.length) }, body), false, BIG_CHUNK);
    } else {
      const payload = encodeMessage({ 'Error-Domain': 'BLIP', 'Error-Code': '404' }, Buffer.from('no handler'));
      this.enqueue(ERR, request.number, ERR, payload, false, BIG_CHUNK);
    }
  }
}

// ------------------------------------------------------------------------------ the checks

function expectEcho(reply, body, what) {
  if (reply.type !== RPY) {
    throw new Error(`${what}: got ${TYPE_NAMES[reply.type]} ${JSON.stringify(reply.props)} ${reply.body.toString().slice(0, 80)}`);
  }
  if (!reply.body.equals(body)) {
    throw new Error(`${what}: body differs: sent ${describeBody(body)}, got ${describeBody(reply.body)}`);
  }
  if (reply.props['X-Len'] !== String(body.length)) {
    throw new Error(`${what}: X-Len is ${JSON.stringify(reply.props['X-Len'])}, expected "${body.length}"`);
  }
}

/** The ACK values a receiver sends for `message` (as we framed it) under the documented rule:
 * one ACK each time its count crosses a multiple of 50,000, carrying the count at that frame. */
function expectedAcks(message) {
  const values = [];
  let before = 0;
  for (const { sent, more } of message.cumulative) {
    if (more && Math.floor(sent / ACK_INTERVAL) > Math.floor(before / ACK_INTERVAL)) values.push(sent);
    before = sent;
  }
  return values;
}

let strictAcks = false;

/**
 * Judges the ACKs the peer sent for our multi-frame `message`. What a sender depends on is
 * checked always: each value is a count the receiver really had at a frame boundary (so both
 * sides count the same bytes), values only grow, and at the end no more than 50,000 bytes
 * were left unacknowledged. Receivers differ in *when* they ACK (BLIP-Cpp: every 50,000
 * bytes since its last ACK; protocol/blip/README.md: at each multiple of 50,000), so the exact
 * schedule is only enforced with --strict-acks; otherwise it is reported.
 */
function judgeAcks(message, name) {
  const got = message.acks;
  const boundaries = message.cumulative.map((c) => c.sent);
  const expected = expectedAcks(message);
  const context = `${name} values ${JSON.stringify(got)}; our frame byte counts after the header varints: ${JSON.stringify(boundaries)}`;
  if (expected.length && !got.length) throw new Error(`no ${name} for a ${message.sent} B message`);
  const odd = got.filter((v) => !boundaries.includes(v));
  if (odd.length) throw new Error(`${name} value(s) ${odd.join(', ')} match no frame boundary (counting another way?): ${context}`);
  for (let i = 1; i < got.length; i++) {
    if (got[i] <= got[i - 1]) throw new Error(`${name} values do not grow: ${context}`);
  }
  const lastMore = message.cumulative.filter((c) => c.more).at(-1)?.sent ?? 0;
  const highest = got.at(-1) ?? 0;
  if (lastMore - highest >= ACK_INTERVAL) {
    throw new Error(`${name}: ${lastMore - highest} B were never acknowledged before the last frame: ${context}`);
  }
  const exact = JSON.stringify(got) === JSON.stringify(expected);
  if (strictAcks && !exact) throw new Error(`${name} schedule differs from ${JSON.stringify(expected)}: ${context}`);
  return exact
    ? `${name} at every 50,000 crossing (${got.join('/')})`
    : `${name} ${got.join('/')}: ${got.length} ACKs for ${expected.length} crossings at ${expected.join('/')}`;
}

function isInterleaved(frames) {
  // True when some message's frames are not contiguous in `frames`.
  const finished = new Set();
  let current = null;
  for (const { key } of frames) {
    if (key !== current) {
      if (current !== null) finished.add(current);
      if (finished.has(key)) return true;
      current = key;
    }
  }
  return false;
}

async function runChecks(url, appId) {
  const subprotocol = `BLIP_3+${appId}`;
  const results = [];
  const print = (line) => process.stdout.write(`${line}\n`);

  async function check(name, fn) {
    try {
      const info = await withTimeout(Promise.resolve().then(fn), CHECK_TIMEOUT_MS, `in ${name}`);
      results.push(true);
      print(info ? `ok ${name} (${info})` : `ok ${name}`);
    } catch (error) {
      results.push(false);
      print(`FAIL ${name}: ${error.message}`);
    }
  }

  let main = null;
  let connections = 0;
  const opened = [];
  async function open(protocols = [subprotocol], options = {}) {
    connections += 1;
    const conn = await BlipConnection.open(url, protocols, { label: `conn${connections}`, ...options });
    opened.push(conn);
    return conn;
  }
  /** The shared connection most checks run on, reopened if an earlier check lost it. */
  async function shared() {
    if (main && main.closed) {
      ledger.protocol.push(`${main.label} closed during the checks (${main.closed.code} ${main.closed.reason})`);
      main = null;
    }
    if (!main) main = await open();
    return main;
  }

  await check('subprotocol', async () => {
    main = await open();
    if (main.ws.protocol !== subprotocol) {
      throw new Error(`server chose ${JSON.stringify(main.ws.protocol)}, expected ${subprotocol}`);
    }
    // Offered among others, ours must still be the one picked.
    const other = await open([`BLIP_3+Not${appId}`, subprotocol, 'chat']);
    const chosen = other.ws.protocol;
    await other.close();
    if (chosen !== subprotocol) throw new Error(`offered three, server chose ${JSON.stringify(chosen)}`);
    return subprotocol;
  });

  await check('subprotocol-refused', async () => {
    let conn;
    try {
      conn = await open([`BLIP_3+Not${appId}`]);
    } catch (error) {
      return `refused: ${error.message}`;
    }
    // A server may also complete the handshake and hang up at once; anything else is wrong.
    const closed = await Promise.race([conn.whenClosed(), sleep(2000).then(() => null)]);
    if (!closed) {
      await conn.close();
      throw new Error(`connection offering only BLIP_3+Not${appId} was accepted (protocol ${JSON.stringify(conn.ws.protocol)})`);
    }
    return `closed at once with ${closed.code}`;
  });

  await check('no-ws-extensions', async () => {
    // BLIP compresses itself, so permessage-deflate should be declined even when offered.
    const conn = await open([subprotocol], { perMessageDeflate: true });
    const extensions = conn.ws.extensions;
    await conn.close();
    if (extensions) throw new Error(`server accepted WebSocket extension(s): ${extensions}`);
    return 'permessage-deflate offered and declined';
  });

  for (const size of [0, 1, 500]) {
    await check(`echo-${size}B`, async () => {
      const conn = await shared();
      const body = noise(size, `small-${size}`);
      const { number, reply } = conn.request('echo', {}, body);
      const answer = await reply;
      expectEcho(answer, body, `echo #${number}`);
      if (answer.record.frames.length !== 1) return `reply in ${answer.record.frames.length} frames`;
    });
  }

  await check('echo-300KiB-request', async () => {
    const conn = await shared();
    const body = noise(300 * 1024, 'request-300k');
    const { number, reply, message } = conn.request('echo', { 'X-Note': 'multi-frame request' }, body, { chunk: BIG_CHUNK });
    const answer = await reply;
    expectEcho(answer, body, `echo #${number}`);
    const requestFrames = message.cumulative.length;
    if (requestFrames < 2) throw new Error(`request went out in ${requestFrames} frame`);
    // ACKs are urgent so they normally precede the reply; allow a moment all the same.
    const crossings = expectedAcks(message).length;
    await waitFor(() => message.acks.at(-1) >= message.sent - ACK_INTERVAL - BIG_CHUNK || message.acks.length >= crossings, 2000, 'ACKs').catch(() => {});
    return `${requestFrames} request frames, ${judgeAcks(message, `ACKMSG #${number}`)}, reply in ${answer.record.frames.length} frames`;
  });

  await check('echo-1MiB-reply', async () => {
    const conn = await shared();
    const body = noise(1024 * 1024, 'reply-1m');
    const { number, reply, message } = conn.request('echo', {}, body);
    const answer = await reply;
    expectEcho(answer, body, `echo #${number}`);
    const { frames, acksSent, maxUnacked, windowBreaches } = answer.record;
    if (frames.length < 2) throw new Error(`1 MiB reply came in ${frames.length} frame`);
    if (windowBreaches.length) throw new Error(`peer overran the window on RPY #${number}: ${windowBreaches[0]}`);
    const requestAcks = judgeAcks(message, `ACKMSG #${number}`);
    return `${frames.length} reply frames, ${acksSent.length} ACKRPY sent, at most ${maxUnacked} B unacknowledged; ${requestAcks}`;
  });

  // The next three share one stalled transfer: a 400 KiB reply we do not acknowledge.
  const stall = { conn: null, number: 0, reply: null, body: null, stalledAt: 0 };
  await check('peer-pauses-at-window', async () => {
    const conn = await shared();
    stall.conn = conn;
    stall.body = noise(400 * 1024, 'stalled');
    const { number, reply, record } = conn.request('echo', {}, stall.body, { withholdAcks: true });
    stall.number = number;
    stall.reply = reply;
    reply.catch(() => {});
    // Wait for the peer to fill its window, then for the stream to go quiet.
    // (A peer that stops early is caught below, so a timeout here is not yet a failure.)
    const finished = () => record.frames.some((f) => !(f.flags & MORECOMING));
    await waitFor(() => record.received > SEND_WINDOW || finished(), 10_000, 'the window').catch(() => {});
    if (record.frames.length === 0) throw new Error(`no frame of RPY #${number} arrived`);
    let seen = -1;
    while (seen !== record.frames.length) {
      seen = record.frames.length;
      await sleep(QUIET_MS);
    }
    const last = record.frames.at(-1);
    stall.stalledAt = record.received;
    if (!(last.flags & MORECOMING)) {
      throw new Error(`peer sent the whole reply (${record.received} B in ${record.frames.length} frames) without an ACKRPY`);
    }
    if (record.received > SEND_WINDOW + last.size) {
      throw new Error(`peer sent ${record.received} B unacknowledged (window ${SEND_WINDOW} + last frame ${last.size})`);
    }
    if (record.received <= SEND_WINDOW) {
      throw new Error(`peer stopped at ${record.received} B, before using its ${SEND_WINDOW} B window`);
    }
    return `stopped at ${record.received} B after ${record.frames.length} frames`;
  });

  await check('no-head-of-line-blocking', async () => {
    if (!stall.reply) throw new Error('no stalled reply to test against');
    const { conn } = stall;
    const bodies = Array.from({ length: 19 }, (_, i) => noise(37 * i + 1, `hol-${i}`));
    const requests = bodies.map((body) => conn.request('echo', {}, body));
    const answers = await Promise.all(requests.map((r) => r.reply));
    answers.forEach((answer, i) => expectEcho(answer, bodies[i], `echo #${requests[i].number}`));
    const record = conn.replyRecords.get(stall.number);
    if (record.received !== stall.stalledAt) {
      throw new Error(`stalled reply moved from ${stall.stalledAt} to ${record.received} B without an ACK`);
    }
    return '19 small replies completed while RPY #' + stall.number + ' waited for an ACK';
  });

  await check('peer-resumes-on-ack', async () => {
    if (!stall.reply) throw new Error('no stalled reply to resume');
    stall.conn.releaseAcks(stall.number);
    const answer = await stall.reply;
    expectEcho(answer, stall.body, `echo #${stall.number}`);
    if (answer.record.windowBreaches.length) throw new Error(`after resuming: ${answer.record.windowBreaches[0]}`);
    return `${answer.record.frames.length} frames in all`;
  });

  await check('compressed-reply', async () => {
    const conn = await shared();
    const notes = [];
    // Two in a row: the second must inflate with the window the first left behind.
    for (const size of [64 * 1024, 40 * 1024]) {
      const body = prose(size);
      const { number, reply } = conn.request('echo', { 'X-Compress': '1' }, body);
      const answer = await reply;
      expectEcho(answer, body, `echo #${number}`);
      const frames = answer.record.frames;
      const plain = frames.filter((f) => !(f.flags & COMPRESSED));
      // Only an empty last frame may go uncompressed.
      const wrong = plain.filter((f) => !(f === frames.at(-1) && f.plain === 0));
      if (wrong.length) {
        throw new Error(`RPY #${number}: ${plain.length} of ${frames.length} frames lack the Compressed flag`);
      }
      const wire = frames.reduce((sum, f) => sum + f.size, 0);
      notes.push(`#${number} ${size} B in ${frames.length} frames, ${wire} B on the wire`);
    }
    return notes.join('; ');
  });

  await check('compressed-request', async () => {
    const conn = await shared();
    const notes = [];
    for (const [size, props] of [[48 * 1024, {}], [30 * 1024, { 'X-Compress': '1' }]]) {
      const body = prose(size);
      const { number, reply, message } = conn.request('echo', props, body, { compress: true, chunk: SMALL_CHUNK * 2 });
      const answer = await reply;
      expectEcho(answer, body, `echo #${number} (compressed request)`);
      notes.push(`#${number} ${message.cumulative.length} compressed frames, ${message.sent} B on the wire`);
    }
    // And the connection still carries plain traffic afterwards.
    const body = noise(100, 'after-compressed');
    const { number, reply } = conn.request('echo', {}, body);
    expectEcho(await reply, body, `echo #${number}`);
    return notes.join('; ');
  });

  await check('compressed-mixed-frames', async () => {
    const conn = await shared();
    // The Compressed flag belongs to a frame, not a message: alternate it within one request.
    const body = prose(40 * 1024);
    const { number, reply, message } = conn.request('echo', {}, body, { compress: 'alternate', chunk: SMALL_CHUNK * 2 });
    expectEcho(await reply, body, `echo #${number} (alternating compressed frames)`);
    return `#${number} in ${message.cumulative.length} frames, every other one compressed`;
  });

  await check('properties-across-frames', async () => {
    const conn = await shared();
    // ~30 KB of properties in 1,000-byte frames, with multi-byte UTF-8 cut at frame edges.
    const props = {};
    for (let i = 0; i < 30; i++) props[`X-Filler-${i}`] = `${'é'.repeat(300)}€${'x'.repeat(i)}`;
    const body = noise(100, 'after-properties');
    const { number, reply, message } = conn.request('echo', props, body, { chunk: 1_000 });
    expectEcho(await reply, body, `echo #${number}`);
    const propsLength = encodeProperties({ Profile: 'echo', ...props }).length;
    return `${propsLength} B of properties, message in ${message.cumulative.length} frames`;
  });

  await check('fail', async () => {
    const conn = await shared();
    const { number, reply } = conn.request('fail', {}, Buffer.alloc(0));
    const answer = await reply;
    if (answer.type !== ERR) throw new Error(`#${number}: got ${TYPE_NAMES[answer.type]}, expected ERR`);
    const domain = answer.props['Error-Domain'];
    const code = answer.props['Error-Code'];
    if (!domain) throw new Error(`ERR #${number} has no Error-Domain: ${JSON.stringify(answer.props)}`);
    if (!/^-?[0-9]+$/.test(code ?? '')) throw new Error(`ERR #${number} Error-Code ${JSON.stringify(code)} is not a decimal integer`);
    let text;
    try {
      text = new TextDecoder('utf-8', { fatal: true }).decode(answer.body);
    } catch {
      throw new Error(`ERR #${number} body is not UTF-8: ${answer.body.toString('hex')}`);
    }
    if (!text) throw new Error(`ERR #${number} has an empty message body`);
    return `${domain} ${code} ${JSON.stringify(text)}`;
  });

  await check('unknown-profile', async () => {
    const conn = await shared();
    const { number, reply } = conn.request('no-such-profile', {}, Buffer.from('?'));
    const answer = await reply;
    if (answer.type !== ERR) throw new Error(`#${number}: got ${TYPE_NAMES[answer.type]}, expected ERR`);
    const domain = answer.props['Error-Domain'] ?? 'BLIP'; // absent means BLIP
    if (domain !== 'BLIP' || answer.props['Error-Code'] !== '404') {
      throw new Error(`ERR #${number} is ${domain} ${answer.props['Error-Code']}, expected BLIP 404`);
    }
    return `BLIP 404 ${JSON.stringify(answer.body.toString())}`;
  });

  await check('callme', async () => {
    const conn = await shared();
    const notes = [];
    // Twice, so the peer's own request numbers can be seen to count up.
    for (let round = 0; round < 2; round++) {
      const before = conn.peerRequests.length;
      const { number, reply } = conn.request('callme', {}, Buffer.alloc(0));
      const answer = await reply;
      if (answer.type !== RPY) throw new Error(`callme #${number}: got ${TYPE_NAMES[answer.type]} ${answer.body}`);
      await waitFor(() => conn.peerRequests.length > before, 5000, 'the peer to call back');
      const call = conn.peerRequests[before];
      if (call.props.Profile !== 'hello') throw new Error(`peer's request has Profile ${JSON.stringify(call.props.Profile)}`);
      if (call.number !== before + 1) throw new Error(`peer's request is #${call.number}, expected #${before + 1}`);
      notes.push(`MSG #${call.number} Profile=hello ${JSON.stringify(call.body.toString())}`);
    }
    // Our reply to the second call must not have upset the peer.
    const body = Buffer.from('still there?');
    const { number, reply } = conn.request('echo', {}, body);
    expectEcho(await reply, body, `echo #${number} after the callbacks`);
    return notes.join('; ');
  });

  await check('noreply', async () => {
    const conn = await shared();
    const quiet = conn.request('echo', {}, Buffer.from('do not answer'), { noReply: true });
    const body = Buffer.from('answer this one');
    const { number, reply } = conn.request('echo', {}, body);
    expectEcho(await reply, body, `echo #${number}`);
    await sleep(200);
    const stray = conn.rxFrames.filter((f) => f.key === `r:${quiet.number}`);
    const complaint = ledger.numbering.find((n) => n.includes(`#${quiet.number} answers no request`));
    if (stray.length || complaint) throw new Error(`peer answered NoReply request #${quiet.number}`);
    return `#${quiet.number} unanswered, #${number} answered`;
  });

  await check('concurrent-20', async () => {
    const conn = await shared();
    const firstFrame = conn.sentFrames.length;
    const firstRx = conn.rxFrames.length;
    const jobs = [];
    for (let i = 0; i < 20; i++) {
      // Sizes from 1 B to ~60 KiB, some compressed each way, a couple urgent.
      const size = (i * 3109 + 1) % 61_000;
      const body = i % 3 === 0 ? prose(size) : noise(size, `concurrent-${i}`);
      const props = i % 4 === 1 ? { 'X-Compress': '1' } : {};
      const options = { chunk: SMALL_CHUNK, compress: i % 5 === 2, urgent: i % 7 === 3 };
      jobs.push({ body, ...conn.request('echo', props, body, options) });
    }
    const numbers = jobs.map((j) => j.number);
    const answers = await Promise.all(jobs.map((j) => j.reply));
    answers.forEach((answer, i) => {
      expectEcho(answer, jobs[i].body, `echo #${jobs[i].number}`);
      if (answer.number !== jobs[i].number) throw new Error(`reply #${answer.number} for request #${jobs[i].number}`);
    });
    const ours = isInterleaved(conn.sentFrames.slice(firstFrame));
    if (!ours) throw new Error('our own request frames were not interleaved (client bug)');
    const theirs = isInterleaved(conn.rxFrames.slice(firstRx).filter((f) => f.key.startsWith('r:')));
    const frames = answers.reduce((sum, a) => sum + a.record.frames.length, 0);
    return `#${numbers[0]}..#${numbers.at(-1)}, ${frames} reply frames, reply frames interleaved: ${theirs ? 'yes' : 'no'}`;
  });

  await check('rejects-out-of-sequence', async () => {
    const conn = await open();
    // The first request on a connection must be #1; send #2 with a correct CRC.
    const payload = encodeMessage({ Profile: 'echo' }, Buffer.from('x'));
    conn.sendRaw(encodeFrame(2, MSG, payload, crc32(0, payload)));
    const closed = await withTimeout(conn.whenClosed(), 5000, 'for the peer to close');
    if (closed.code !== 1002) throw new Error(`closed with ${closed.code} ${closed.reason}, expected 1002`);
    return `closed 1002 ${JSON.stringify(closed.reason)}`;
  });

  await check('rejects-bad-crc', async () => {
    const conn = await open();
    const payload = encodeMessage({ Profile: 'echo' }, Buffer.from('x'));
    conn.sendRaw(encodeFrame(1, MSG, payload, crc32(0, payload) ^ 1));
    const closed = await withTimeout(conn.whenClosed(), 5000, 'for the peer to close');
    if (closed.code !== 1002) throw new Error(`closed with ${closed.code} ${closed.reason}, expected 1002`);
    return `closed 1002 ${JSON.stringify(closed.reason)}`;
  });

  await check('request-numbering', async () => {
    if (ledger.numbering.length) throw new Error(ledger.numbering.slice(0, 3).join('; '));
    const conn = await shared();
    return `${conn.nextRequest - 1} requests and ${conn.lastPeerRequest} peer requests on ${conn.label}, all in sequence`;
  });

  await check('crc-running', async () => {
    if (ledger.crcFailures.length) throw new Error(`${ledger.crcFailures.length} bad: ${ledger.crcFailures.slice(0, 2).join('; ')}`);
    if (ledger.framesChecked === 0) throw new Error('no frame was checked');
    return `${ledger.framesChecked} frames`;
  });

  await check('ack-frames', async () => {
    if (ledger.ackProblems.length) throw new Error(ledger.ackProblems.slice(0, 3).join('; '));
    if (ledger.acksSeen === 0) throw new Error('the peer sent no ACK at all');
    return `${ledger.acksSeen} ACK frames, all Urgent|NoReply with a bare count`;
  });

  await check('clean-close', async () => {
    if (ledger.protocol.length) throw new Error(ledger.protocol.slice(0, 3).join('; '));
    const conn = await shared();
    await withTimeout(Promise.all([conn.rxChain]), 1000, 'for pending frames');
    const closed = await withTimeout(conn.close(1000), 5000, 'for the closing handshake');
    if (closed.code !== 1000) throw new Error(`closed with ${closed.code} ${closed.reason}`);
    return 'no protocol problem noticed; closed 1000';
  });

  for (const conn of opened) if (!conn.closed) conn.ws.terminate();
  const passed = results.filter(Boolean).length;
  const failed = results.length - passed;
  print(`${passed} passed, ${failed} failed`);
  return failed === 0 ? 0 : 1;
}

// ------------------------------------------------------------------------------ golden vectors

const sha256 = (data) => createHash('sha256').update(data).digest('hex');

/**
 * Decodes every stream of a golden-vector file (protocol/blip/vectors.json) with this client's
 * own codec: header, running CRC, shared inflate stream, properties, message reassembly; for
 * `exact` streams also re-encodes each frame and compares bytes. One check per stream.
 */
async function checkVectors(path) {
  const { readFile } = await import('node:fs/promises');
  const vectors = JSON.parse(await readFile(path, 'utf8'));
  let passed = 0;
  let failed = 0;
  for (const stream of vectors.streams) {
    const inflater = new ZStream(true);
    try {
      let crc = 0;
      const assembling = new Map();
      for (const [index, vector] of stream.frames.entries()) {
        const where = `frame ${index + 1} (${vector.meaning})`;
        const frame = Buffer.from(vector.hex, 'hex');
        const [number, afterNumber] = readUvarint(frame, 0);
        const [flags, offset] = readUvarint(frame, afterNumber);
        const type = flags & TYPE_MASK;
        if (number !== vector.number || flags !== vector.flags || TYPE_NAMES[type] !== vector.type) {
          throw new Error(`${where}: decoded #${number} ${flagText(flags)}, vector says #${vector.number} ${vector.flags_text}`);
        }
        if (type === ACKMSG || type === ACKRPY) {
          const [count, end] = readUvarint(frame, offset);
          if (end !== frame.length || count !== vector.ack_bytes) throw new Error(`${where}: ACK count ${count}, vector says ${vector.ack_bytes}`);
          if (stream.exact && !encodeFrame(number, flags, uvarint(count)).equals(frame)) throw new Error(`${where}: re-encoded ACK differs`);
          continue;
        }
        const wireBody = frame.subarray(offset, frame.length - 4);
        const payload = flags & COMPRESSED ? await inflater.run(Buffer.concat([wireBody, SYNC_TAIL])) : wireBody;
        crc = crc32(crc, payload);
        const written = frame.readUInt32BE(frame.length - 4);
        if (crc !== written || crc !== vector.crc32) {
          throw new Error(`${where}: running CRC ${crc}, frame carries ${written}, vector says ${vector.crc32}`);
        }
        if (payload.length !== vector.payload_length || sha256(payload) !== vector.payload_sha256) {
          throw new Error(`${where}: payload ${payload.length} B ${sha256(payload).slice(0, 12)} differs from the vector's`);
        }
        if (stream.exact && !(flags & COMPRESSED) && !encodeFrame(number, flags, payload, crc).equals(frame)) {
          throw new Error(`${where}: re-encoding gives other bytes`);
        }
        const key = `${type === MSG ? 'q' : 'r'}:${number}`;
        const parts = assembling.get(key) ?? [];
        parts.push(payload);
        assembling.set(key, parts);
        if (flags & MORECOMING) continue;
        assembling.delete(key);
        const { props, body } = decodeMessage(Buffer.concat(parts));
        const expected = vector.message;
        if (JSON.stringify(props) !== JSON.stringify(expected.properties)) {
          throw new Error(`${where}: properties ${JSON.stringify(props)}, vector says ${JSON.stringify(expected.properties)}`);
        }
        if (body.length !== expected.body.length || sha256(body) !== expected.body.sha256) {
          throw new Error(`${where}: body ${body.length} B differs from the vector's ${expected.body.length} B`);
        }
      }
      if (assembling.size) throw new Error(`stream ends inside message(s) ${[...assembling.keys()].join(', ')}`);
      passed += 1;
      process.stdout.write(`ok vectors/${stream.name} (${stream.frames.length} frames)\n`);
    } catch (error) {
      failed += 1;
      process.stdout.write(`FAIL vectors/${stream.name}: ${error.message}\n`);
    } finally {
      inflater.close();
    }
  }
  process.stdout.write(`${passed} passed, ${failed} failed\n`);
  return failed === 0 ? 0 : 1;
}

// ------------------------------------------------------------------------------ command line

function usage(message) {
  if (message) process.stderr.write(`blip_client: ${message}\n`);
  process.stderr.write('usage: node interop/blip_client.mjs ws://HOST:PORT/PATH [--app-id ID] [--trace] [--strict-acks]\n' +
      '       node interop/blip_client.mjs --vectors protocol/blip/vectors.json\n');
  process.exit(2);
}

function selfTest() {
  // The CRC and varint code against known values, so a failure here is not blamed on the peer.
  if (crc32(0, Buffer.from('123456789')) !== 0xcbf43926) throw new Error('crc32 self-test failed');
  if (crc32(crc32(0, Buffer.from('1234')), Buffer.from('56789')) !== 0xcbf43926) throw new Error('running crc32 self-test failed');
  if (uvarint(300).toString('hex') !== 'ac02' || readUvarint(Buffer.from('ac02', 'hex'), 0)[0] !== 300) {
    throw new Error('varint self-test failed');
  }
}

async function main() {
  const args = process.argv.slice(2);
  let url = null;
  let appId = 'P2PSync_1';
  let vectorsPath = null;
  for (let i = 0; i < args.length; i++) {
    if (args[i] === '--app-id') appId = args[++i] ?? usage('--app-id needs a value');
    else if (args[i] === '--trace') traceFrames = true;
    else if (args[i] === '--strict-acks') strictAcks = true;
    else if (args[i] === '--vectors') vectorsPath = args[++i] ?? usage('--vectors needs a file');
    else if (args[i] === '-h' || args[i] === '--help') usage();
    else if (!url) url = args[i];
    else usage(`unexpected argument ${args[i]}`);
  }
  selfTest();
  if (vectorsPath) process.exit(await checkVectors(vectorsPath));
  if (!url || !/^wss?:\/\//.test(url)) usage('give the peer as a ws:// URL');
  process.exit(await runChecks(url, appId));
}

main().catch((error) => {
  process.stderr.write(`blip_client: ${error.stack ?? error}\n`);
  process.exit(2);
});
