// Starts `longctx serve` on a free loopback port for a test file and stops it afterwards.
//
//   const server = await startServer();      // argv[2]: the binary, argv[3]: an optional model
//   ... fetch(server.url + '/health') ...
//   await server.stop();
//
// The server's stdout and stderr go to a log file in the OS temp dir (its path is printed), so a
// failing test can be read against what the server said.
import { spawn } from 'node:child_process';
import { createWriteStream, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';

const LISTEN_RE = /listening on (http:\/\/127\.0\.0\.1:(\d+))/;

export function serverArgs() {
  const binary = process.argv[2] || process.env.LONGCTX_BINARY;
  const model = process.argv[3] || process.env.LONGCTX_MODEL || '';
  if (!binary) {
    console.error(`usage: node ${basename(process.argv[1])} LONGCTX_BINARY [MODEL.gguf]`);
    process.exit(2);
  }
  if (!existsSync(binary)) {
    console.error(`no such binary: ${binary}`);
    process.exit(2);
  }
  return { binary, model };
}

// Imports an npm dependency, or explains how to install them.
export async function importDependency(name) {
  try {
    return await import(name);
  } catch (e) {
    if (e && e.code === 'ERR_MODULE_NOT_FOUND') {
      console.error(`cannot load '${name}': run \`npm ci\` in tests/server/js (scripts/setup.sh does)`);
      process.exit(2);
    }
    throw e;
  }
}

const running = new Set();
process.on('exit', () => { for (const c of running) try { c.kill('SIGKILL'); } catch { /* gone */ } });
for (const sig of ['SIGINT', 'SIGTERM']) {
  process.on(sig, () => { for (const c of running) try { c.kill('SIGKILL'); } catch { /* gone */ } process.exit(130); });
}

export async function startServer({ extraArgs = [], timeoutMs = 60_000, slots = 4 } = {}) {
  const { binary, model } = serverArgs();
  const args = ['serve', '--host', '127.0.0.1', '--port', '0', '-np', String(slots)];
  if (model) args.push('-m', model);
  args.push(...extraArgs);
  const logPath = join(tmpdir(), `longctx-serve-${process.pid}-${Date.now()}.log`);
  const log = createWriteStream(logPath);
  log.write(`$ ${binary} ${args.join(' ')}\n`);
  console.error(`# server: ${binary} ${args.join(' ')}  (log: ${logPath})`);

  const child = spawn(binary, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  running.add(child);
  let tail = '';
  const keepTail = (s) => { tail = (tail + s).slice(-4000); };
  let exited = null;
  const exitPromise = new Promise((resolve) => {
    child.on('exit', (code, signal) => {
      exited = { code, signal };
      running.delete(child);
      resolve(exited);
    });
  });
  child.stderr.on('data', (d) => { log.write(d); keepTail(d.toString()); });

  const url = await new Promise((resolve, reject) => {
    let buf = '';
    let found = false;
    const timer = setTimeout(() => {
      if (found) return;
      child.kill('SIGKILL');
      reject(new Error(`no "listening on http://127.0.0.1:PORT" line on stdout within ${timeoutMs / 1000} s; ` +
                       `output so far:\n${tail}`));
    }, timeoutMs);
    child.stdout.on('data', (d) => {
      log.write(d);
      keepTail(d.toString());
      if (found) return;
      buf += d.toString();
      const m = LISTEN_RE.exec(buf);
      if (m) { found = true; clearTimeout(timer); resolve(m[1]); }
      else if (buf.length > 1 << 20) buf = buf.slice(-4096);
    });
    child.on('error', (e) => { clearTimeout(timer); reject(e); });
    exitPromise.then(({ code, signal }) => {
      if (found) return;
      clearTimeout(timer);
      reject(new Error(`server exited (code ${code}, signal ${signal}) before listening; output:\n${tail}`));
    });
  });

  return {
    url,
    logPath,
    child,
    get exited() { return exited; },
    tail: () => tail,
    // SIGTERM, then SIGKILL after 10 s; resolves with the exit status.
    async stop() {
      if (exited) { log.end(); return exited; }
      child.kill('SIGTERM');
      const t = setTimeout(() => { if (!exited) child.kill('SIGKILL'); }, 10_000);
      const r = await exitPromise;
      clearTimeout(t);
      log.end();
      return r;
    },
  };
}

// Reads a fetch Response's server-sent events; returns the parsed JSON of each `data:` line and
// whether the stream ended with `data: [DONE]`.
export async function readSSE(response) {
  const text = await response.text();
  const events = [];
  let done = false;
  for (const raw of text.split('\n')) {
    const line = raw.replace(/\r$/, '');
    if (!line.startsWith('data:')) continue;
    const data = line.slice(5).trimStart();
    if (data === '[DONE]') { done = true; continue; }
    if (done) throw new Error(`data after [DONE]: ${data}`);
    events.push(JSON.parse(data));
  }
  return { events, done };
}
