#!/usr/bin/env node
// Generates the interop scenarios (interop/scenarios/*.json) by authoring messages with the
// reference DWN's own classes and observing what the reference answers.
//
//   node interop/gen_scenarios.mjs [--out DIR] [--only NAME_SUBSTRING ...] [--list]
//
// Each scenario is built against a fresh reference DWN; a step whose observed code differs
// from the code its author wanted fails the run (nothing is written for that scenario), so
// the committed files only claim what the reference does. Keys and timestamps come from
// fixed seeds and a logical clock: regenerating gives identical files.

import { mkdirSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { ScenarioBuilder, serializeScenario } from './lib/scenario.mjs';
import { scenarios as recordScenarios } from './lib/scenarios-records.mjs';
import { scenarios as protocolScenarios } from './lib/scenarios-protocols.mjs';
import { scenarios as permissionScenarios } from './lib/scenarios-permissions.mjs';
import { scenarios as messageScenarios } from './lib/scenarios-messages.mjs';

// Library warnings must not interleave with our report.
console.warn = () => {};

const HERE = dirname(fileURLToPath(import.meta.url));
const ALL = [...recordScenarios, ...protocolScenarios, ...permissionScenarios, ...messageScenarios];

// Timestamps that leak from the wall clock would make files non-reproducible and could
// change behaviour when replayed later; every authored timestamp must be on the 2024 clock.
const WALL_CLOCK_LEAK = /"(?:messageTimestamp|dateCreated|datePublished|dateExpires)":"(?!2024-)/;

function parseArgs(argv) {
  const args = { out: join(HERE, 'scenarios'), only: [], list: false };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--out') {
      args.out = argv[++i];
    } else if (a === '--only') {
      args.only.push(argv[++i]);
    } else if (a === '--list') {
      args.list = true;
    } else {
      throw new Error(`unknown argument ${a}`);
    }
  }
  return args;
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const names = new Set();
  for (const s of ALL) {
    if (names.has(s.name)) {
      throw new Error(`duplicate scenario name ${s.name}`);
    }
    names.add(s.name);
  }
  if (args.list) {
    for (const s of ALL) {
      console.log(`${s.name}\t${s.description}`);
    }
    return;
  }
  const selected = args.only.length === 0 ? ALL : ALL.filter((s) => args.only.some((o) => s.name.includes(o)));
  mkdirSync(args.out, { recursive: true });
  if (args.only.length === 0) {
    // a full run owns its files: drop those of scenarios that no longer exist, but leave the
    // ones p2psync authors (`python -m p2psync.conformance author`) alone
    for (const f of readdirSync(args.out)) {
      if (f.endsWith('.json') && !f.startsWith('p2psync-authored-')) {
        rmSync(join(args.out, f));
      }
    }
  }

  const started = Date.now();
  let totalSteps = 0;
  let failed = 0;
  for (const def of selected) {
    const S = new ScenarioBuilder(def);
    await S.open();
    try {
      await def.build(S);
    } catch (e) {
      S.failures.push(`build threw: ${e?.stack ?? e}`);
    } finally {
      await S.close();
    }
    const text = serializeScenario(S.toJSON());
    if (WALL_CLOCK_LEAK.test(text)) {
      S.failures.push('a timestamp is not on the logical clock (wall-clock leak)');
    }
    if (S.failures.length > 0) {
      failed++;
      process.stdout.write(`FAIL ${def.name}\n`);
      for (const f of S.failures) {
        process.stdout.write(`     ${f}\n`);
      }
      continue;
    }
    writeFileSync(join(args.out, `${def.name}.json`), text);
    totalSteps += S.steps.length;
    process.stdout.write(`ok   ${def.name} (${S.steps.length} steps)\n`);
  }
  const seconds = ((Date.now() - started) / 1000).toFixed(1);
  process.stdout.write(`${selected.length - failed} scenarios written, ${totalSteps} steps, ${failed} failed, ${seconds} s\n`);
  process.exitCode = failed === 0 ? 0 : 1;
}

main().catch((e) => {
  process.stderr.write(`${e?.stack ?? e}\n`);
  process.exit(1);
});
