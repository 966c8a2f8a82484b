// Every ```js block of packages/js/README.md and examples/README.md runs as
// written (issue #17): each is written to a temporary .mjs file inside this
// package, so that `import … from '@idem/guard'` (and '@idem/guard/redis',
// …) resolves through the package's own "exports", and run with `node`; it
// must exit 0, twice (a second run finds the keys the first left on a
// shared server, and replays). A block marked `<!-- snippet: skip — why -->` on the line
// above its fence is counted but not run. The number of blocks each README
// holds is asserted, so removing a fence cannot make this pass.
//
// A block that names the local Redis or PostgreSQL server needs
// IDEM_TEST_REDIS_URL / IDEM_TEST_POSTGRES_URL set, as the other store
// tests do: it fails without them, unless IDEM_TEST_SKIP_NETSTORES=1.

import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { serverUrl, skipWithout } from '../testing/netstores.js';

const run = promisify(execFile);
const pkg = fileURLToPath(new URL('..', import.meta.url));
const root = join(pkg, '..', '..');

// README (relative to the repository root) → how many ```js blocks it holds.
const READMES = {
  'packages/js/README.md': 3,
  'examples/README.md': 3,
};

/** The ```js blocks of a Markdown text: `{ line, code, skip }` (skip: the reason, or null). */
function blocks(markdown, lang) {
  const lines = markdown.split('\n');
  const found = [];
  for (let i = 0; i < lines.length; i++) {
    if (lines[i].trim() !== `\`\`\`${lang}`) continue;
    const start = i;
    const code = [];
    for (i++; i < lines.length && lines[i].trim() !== '```'; i++) code.push(lines[i]);
    assert.ok(i < lines.length, `the block at line ${start + 1} is not closed`);
    const marker = /^<!--\s*snippet:\s*skip\b\s*(.*?)\s*-->$/.exec(lines[start - 1]?.trim() ?? '');
    found.push({ line: start + 1, code: `${code.join('\n')}\n`, skip: marker ? marker[1] || 'marked skip' : null });
  }
  return found;
}

const SERVERS = [
  ['redis://', 'IDEM_TEST_REDIS_URL'],
  ['postgres://', 'IDEM_TEST_POSTGRES_URL'],
];

for (const [readme, expected] of Object.entries(READMES)) {
  const found = blocks(readFileSync(join(root, readme), 'utf8'), 'js');

  test(`${readme} holds ${expected} js blocks`, () => {
    assert.equal(found.length, expected, `${readme}: expected ${expected} \`\`\`js blocks, found ${found.length}`);
  });

  for (const block of found) {
    const needs = SERVERS.filter(([scheme]) => block.code.includes(scheme)).map(([, name]) => name);
    const skip = block.skip ?? needs.map(skipWithout).find(Boolean) ?? false;
    test(`${readme}:${block.line} runs as written`, { skip }, async () => {
      for (const name of needs) serverUrl(name); // throws when unset
      const dir = mkdtempSync(join(pkg, '.readme-snippet-'));
      try {
        const file = join(dir, 'snippet.mjs');
        writeFileSync(file, block.code);
        // Twice: a block that writes to a shared server must still pass when its keys are there.
        for (const attempt of ['first', 'second']) {
          try {
            await run(process.execPath, [file], { cwd: dir, timeout: 60_000 });
          } catch (error) {
            assert.fail(
              `${readme}:${block.line} failed on its ${attempt} run (exit ${error.code}):\n${error.stderr || error.message}\n--- the block:\n${block.code}`,
            );
          }
        }
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    });
  }
}
