// Every block of packages/js/README.md and the ```js blocks of
// examples/README.md run as written (issues #17, #46):
// - ```js: written to a temporary .mjs file inside this package, so that
//   `import … from '@idem/guard'` (and '@idem/guard/redis', …) resolves
//   through the package's own "exports", and run with `node`; it must exit
//   0, twice (a second run finds the keys the first left on a shared server,
//   and replays);
// - ```ts: written to a temporary .ts file inside this package and
//   type-checked with the package's tsconfig.json (strict, no emit);
// - ```sh: run with bash from the root of a scratch copy of the repository's
//   files it can use (packages/js as a clone has it, wit/store-layout,
//   scripts/), with
//   IDEM_COMPONENT set to the component under test, so that build.sh packs
//   it as it is (that build.sh builds the same bytes from guest/ alone,
//   examples/run-polyglot-tests.sh checks).
// A block marked `<!-- snippet: skip — why -->` on the line above its fence
// is counted but not run. The number of blocks of each language each README
// holds is asserted, so removing a fence cannot make this pass.
//
// A block that names the local Redis or PostgreSQL server needs
// IDEM_TEST_REDIS_URL / IDEM_TEST_POSTGRES_URL set, as the other store
// tests do: it fails without them, unless IDEM_TEST_SKIP_NETSTORES=1.

import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, dirname, join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { serverUrl, skipWithout } from '../testing/netstores.js';

const run = promisify(execFile);
const pkg = fileURLToPath(new URL('..', import.meta.url));
const root = join(pkg, '..', '..');

// README (relative to the repository root) → how many blocks of each language it holds (and this test runs).
const READMES = {
  'packages/js/README.md': { js: 5, ts: 1, sh: 2 },
  'examples/README.md': { js: 3 },
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

/** A ```js block, run twice with node from a directory inside this package. */
async function runJs(where, block) {
  const dir = mkdtempSync(join(pkg, '.readme-snippet-'));
  try {
    const file = join(dir, 'snippet.mjs');
    writeFileSync(file, block.code);
    // Twice: a block that writes to a shared server must still pass when its keys are there.
    for (const attempt of ['first', 'second']) {
      try {
        await run(process.execPath, [file], { cwd: dir, timeout: 60_000 });
      } catch (error) {
        assert.fail(`${where} failed on its ${attempt} run (exit ${error.code}):\n${error.stderr || error.message}\n--- the block:\n${block.code}`);
      }
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

const tsc = join(pkg, 'node_modules', '.bin', 'tsc');

/** A ```ts block, type-checked with the package's tsconfig.json. */
async function checkTs(where, block) {
  const dir = mkdtempSync(join(pkg, '.readme-snippet-'));
  try {
    writeFileSync(join(dir, 'snippet.ts'), block.code);
    writeFileSync(join(dir, 'tsconfig.json'), JSON.stringify({ extends: '../tsconfig.json', files: ['snippet.ts'], include: [] }));
    try {
      await run(tsc, ['-p', dir], { cwd: dir, timeout: 120_000 });
    } catch (error) {
      assert.fail(`${where} does not type-check:\n${error.stdout}${error.stderr}\n--- the block:\n${block.code}`);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** A ```sh block, run with bash from the root of a scratch copy of the files it may use. */
async function runSh(where, block) {
  const scratch = mkdtempSync(join(tmpdir(), 'idem-readme-sh-'));
  try {
    // The sources as a clone has them: nothing installed, transpiled, built or packed (this test may run
    // in a copy of the repository without .git, as the top-level README's test makes one).
    const built = new Set(['node_modules', 'gen', 'store-layout', 'idem-guard.wasm']);
    const source = (path) => {
      const name = basename(path);
      return !built.has(name) && !name.startsWith('.readme-snippet-') && !name.endsWith('.tgz');
    };
    for (const dir of ['packages/js', 'wit/store-layout', 'scripts']) {
      mkdirSync(dirname(join(scratch, dir)), { recursive: true });
      cpSync(join(root, dir), join(scratch, dir), { recursive: true, filter: (path) => dir !== 'packages/js' || source(path) });
    }
    const component = process.env.IDEM_COMPONENT || join(pkg, 'idem-guard.wasm');
    assert.ok(existsSync(component), `no component at ${component}: run packages/js/build.sh first`);
    // A user's environment: none of the variables `npm test` sets for itself.
    const env = Object.fromEntries(Object.entries(process.env).filter(([name]) => !name.startsWith('npm_')));
    try {
      await run('bash', ['-euo', 'pipefail', '-c', block.code], { cwd: scratch, env: { ...env, IDEM_COMPONENT: component }, timeout: 300_000 });
    } catch (error) {
      assert.fail(`${where} failed (exit ${error.code}):\n${error.stdout}${error.stderr}\n--- the block:\n${block.code}`);
    }
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
}

const RUNNERS = { js: runJs, ts: checkTs, sh: runSh };

for (const [readme, expected] of Object.entries(READMES)) {
  const markdown = readFileSync(join(root, readme), 'utf8');
  for (const [lang, count] of Object.entries(expected)) {
    const found = blocks(markdown, lang);

    test(`${readme} holds ${count} ${lang} blocks`, () => {
      assert.equal(found.length, count, `${readme}: expected ${count} \`\`\`${lang} blocks, found ${found.length}`);
    });

    for (const block of found) {
      const needs = SERVERS.filter(([scheme]) => block.code.includes(scheme)).map(([, name]) => name);
      const skip = block.skip ?? (lang === 'ts' ? false : needs.map(skipWithout).find(Boolean)) ?? false;
      test(`${readme}:${block.line} (${lang}) ${lang === 'ts' ? 'type-checks' : 'runs as written'}`, { skip }, async () => {
        if (lang !== 'ts') for (const name of needs) serverUrl(name); // throws when unset
        await RUNNERS[lang](`${readme}:${block.line}`, block);
      });
    }
  }
}
