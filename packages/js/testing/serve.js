// An HTTP server for a test: `serve(app, (url) => ...)` listens on a free
// port of 127.0.0.1, runs the body with the server's URL and closes the
// server (its keep-alive connections too) whatever the body did. Not part of
// the package (not in package.json `files`), and outside test/ so `node
// --test test/` does not run it as a test file.

import { createServer } from 'node:http';

/** Resolves to what `body(url)` resolves to. */
export async function serve(app, body) {
  const server = createServer(app);
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  try {
    return await body(`http://127.0.0.1:${server.address().port}`);
  } finally {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  }
}
