// The files of the on-store layout (wit/store-layout/: the Redis scripts and
// the PostgreSQL schema and statements), which every host loads as they are.
// They are not copied in git: build.sh copies the folder into the package
// (`store-layout/`, beside this file) before packing; in the repository, the
// stores read wit/store-layout/ itself when there is no copy.

import { existsSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const places = [new URL('./store-layout/', import.meta.url), new URL('../../wit/store-layout/', import.meta.url)];

/** The text of `path` (e.g. `redis/replace.lua`) under the layout folder. */
export function layoutFile(path) {
  for (const dir of places) {
    const file = new URL(path, dir);
    if (existsSync(file)) return readFileSync(file, 'utf8');
  }
  throw new Error(`no ${path} in ${places.map((d) => fileURLToPath(d)).join(' or ')}: build.sh copies wit/store-layout/ into the package`);
}
