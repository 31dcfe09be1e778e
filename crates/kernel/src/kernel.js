// sandmesh's JavaScript kernel driver: the same contract as kernel.py (read that first),
// for Node. Cells run as scripts in the driver's global context, so top-level `let`,
// `const`, `var` and functions persist between cells, and a cell's value is its completion
// value (the last expression), as in Node's REPL.
//
// Top-level await: a cell that uses it runs inside an async function (Node's public API has
// no script-level top-level await); declarations at the start of a line become globals
// there so they persist, and `return value` gives the cell's value.
//
// The supervisor (`sandmesh-supervisor kernel javascript`) hands over three fds in
// SANDMESH_KERNEL_FDS: the event pipe, and the non-blocking read ends of the pipes now on
// fds 1 and 2 (Node cannot re-point its own fds), drained before every event so output keeps
// its order, a child's included.
'use strict';
(function main() {
  const fs = require('fs');
  const vm = require('vm');
  const util = require('util');
  const readline = require('readline');
  const { StringDecoder } = require('string_decoder');

  const [EVENTS, OUT, ERR] = process.env.SANDMESH_KERNEL_FDS.split(',').map(Number);
  delete process.env.SANDMESH_KERNEL_FDS;
  const EXT = { 'text/plain': 'txt', 'text/html': 'html', 'image/png': 'png', 'application/json': 'json' };
  const CHUNK = 16384;
  const cell = { workspace: '/workspace', inlineMax: 131072, running: false, interrupt: null };

  function send(event) {
    const line = Buffer.from(JSON.stringify(event) + '\n');
    let at = 0;
    while (at < line.length) at += fs.writeSync(EVENTS, line, at);
  }

  const pipes = [[OUT, 'stdout', new StringDecoder('utf8')], [ERR, 'stderr', new StringDecoder('utf8')]];
  const buffer = Buffer.alloc(65536);
  function drain() {
    for (const [fd, name, decoder] of pipes) {
      for (;;) {
        let n;
        try {
          n = fs.readSync(fd, buffer, 0, buffer.length, null);
        } catch (e) {
          if (e.code === 'EAGAIN') break;
          throw e;
        }
        if (n === 0) break;
        const text = decoder.write(buffer.subarray(0, n));
        if (text) send({ t: 'stream', name, text });
      }
    }
  }
  setInterval(drain, 50).unref();

  function writer(name) {
    return (chunk, encoding, callback) => {
      drain();
      const text = typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString('utf8');
      for (let i = 0; i < text.length; i += CHUNK) send({ t: 'stream', name, text: text.slice(i, i + CHUNK) });
      const done = typeof encoding === 'function' ? encoding : callback;
      if (done) done();
      return true;
    };
  }
  process.stdout.write = writer('stdout');
  process.stderr.write = writer('stderr');

  function emit(kind, mime, value) {
    let raw;
    let base64 = false;
    if (mime === 'image/png') {
      raw = Buffer.isBuffer(value) || value instanceof Uint8Array ? Buffer.from(value) : Buffer.from(String(value), 'base64');
      base64 = true;
    } else if (mime === 'application/json') {
      raw = Buffer.from(typeof value === 'string' ? value : JSON.stringify(value));
    } else {
      raw = Buffer.from(String(value));
    }
    const content = base64 ? raw.toString('base64') : raw.toString('utf8');
    const event = { t: 'output', kind, mime_type: mime };
    if (content.length > cell.inlineMax) {
      const rel = `artifacts/output-${require('crypto').randomBytes(6).toString('hex')}.${EXT[mime]}`;
      fs.mkdirSync(`${cell.workspace}/artifacts`, { recursive: true });
      fs.writeFileSync(`${cell.workspace}/${rel}`, raw);
      event.path = rel;
    } else {
      event.content = content;
      if (base64) event.base64 = true;
    }
    send(event);
  }

  function publish(value, kind) {
    drain();
    const bundle = {};
    for (const [mime, method] of [['text/html', '_repr_html_'], ['image/png', '_repr_png_'], ['application/json', '_repr_json_']]) {
      if (value !== null && typeof value === 'object' && typeof value[method] === 'function') {
        try {
          const got = value[method]();
          if (got !== undefined && got !== null) bundle[mime] = got;
        } catch (e) { /* a broken representation is skipped */ }
      }
    }
    bundle['text/plain'] = typeof value === 'string' ? util.inspect(value) : util.inspect(value, { depth: 4 });
    for (const [mime, data] of Object.entries(bundle)) emit(kind, mime, data);
  }

  globalThis.display = (...values) => values.forEach((v) => publish(v, 'display'));
  globalThis.require = require;

  function errorEvent(e) {
    const isError = e instanceof Error || (e && typeof e.stack === 'string');
    return {
      t: 'error',
      name: isError ? String(e.name) : 'Error',
      value: isError ? String(e.message) : util.inspect(e),
      // The driver's and Node's own frames are noise: the cell's are `<cell>`, its modules'
      // their paths.
      traceback: isError
        ? String(e.stack).split('\n').filter((l) => !/\[eval\]|\(node:|at node:|sigintHandlersWrap/.test(l)).map((l) => l + '\n')
        : [],
    };
  }

  // Between cells an interrupt has nothing to stop; during an awaited cell it ends the wait.
  process.on('SIGINT', () => {
    if (cell.interrupt) cell.interrupt(new Error('Script execution was interrupted by `SIGINT`'));
  });

  async function execute(code) {
    let script;
    try {
      script = new vm.Script(code, { filename: '<cell>' });
    } catch (e) {
      if (!(e instanceof SyntaxError) || !/await/.test(e.message)) throw e;
      const body = code.replace(/^(?:let|const|var)\s+(?=[A-Za-z_$][\w$]*\s*=)/gm, '');
      script = new vm.Script(`(async () => {\n${body}\n})()`, { filename: '<cell>' });
    }
    let value = script.runInThisContext({ breakOnSigint: true, displayErrors: false });
    if (value instanceof Promise) {
      value = await Promise.race([value, new Promise((_, reject) => { cell.interrupt = reject; })]);
    }
    return value;
  }

  const lines = readline.createInterface({ input: process.stdin, terminal: false });
  let queue = Promise.resolve();
  lines.on('line', (line) => {
    queue = queue.then(async () => {
      let id = null;
      let error = null;
      try {
        const request = JSON.parse(line);
        id = request.id;
        cell.workspace = request.workspace || cell.workspace;
        cell.inlineMax = Number(request.inline_max || cell.inlineMax);
        const value = await execute(String(request.code));
        if (value !== undefined) {
          globalThis._ = value;
          publish(value, 'result');
        }
      } catch (e) {
        error = errorEvent(e);
      } finally {
        cell.interrupt = null;
      }
      if (error) process.stderr.write(error.traceback.join('') || `${error.name}: ${error.value}\n`);
      drain();
      if (error) send(error);
      send({ t: 'done', id });
    });
  });
  lines.on('close', () => process.exit(0));
})();
