// pty.js: one terminal session's WebSocket (SPEC §7), with reconnects
// that lose nothing. It knows the wire protocol and nothing of the DOM.
//
// The connection counts the output bytes it has delivered (`received`, an
// absolute offset into the session's output). A re-attach asks for
// since=received; the server answers with one replay frame that starts at
// the offset of its first byte, so only bytes the page does not have are
// written, and a replay that starts past `received` means the gateway no
// longer retained the bytes in between.

const CH_STDIN = 0x00;
const CH_OUTPUT = 0x01;
const CH_STDERR = 0x02;
const CH_REPLAY = 0x03;

const CLOSE_TAKEN_OVER = 4001;

const PING_EVERY_MS = 20000;
const SILENT_AFTER_MS = 50000; // nothing heard for this long: the connection is dead
const BACKOFF_MIN_MS = 250;
const BACKOFF_MAX_MS = 10000;
const BUSY_RETRIES = 5; // re-attach tries while the gateway still sees our old connection

const encoder = new TextEncoder();

// PtyConnection attaches to one session and keeps it attached.
//
// Callbacks (all optional):
//   onData(Uint8Array)      output to show, each byte exactly once, in order
//   onState(state, detail)  state is one of: connecting, connected,
//                           reconnecting {attempt, delayMs}, busy {retrying},
//                           taken-over, exited {code}, gone, denied, error {message}
//   onLost(n, dueToDrop)    n bytes of output are gone from the gateway's ring
//   onNotice(text)          a protocol error frame from the server
export class PtyConnection {
  // api: {sessionInfo(sid) -> Promise<info>, wsURL(path) -> string, token},
  // sandboxId, sessionId: the session to attach to.
  constructor({ api, sandboxId, sessionId, onData, onState, onLost, onNotice }) {
    this.api = api;
    this.sandboxId = sandboxId;
    this.sessionId = sessionId;
    this.onData = onData || (() => {});
    this.onState = onState || (() => {});
    this.onLost = onLost || (() => {});
    this.onNotice = onNotice || (() => {});

    this.received = 0;       // absolute offset of the next output byte
    this.attaches = 0;       // successful attaches so far
    this.everConnected = false;
    this.dialed = false;     // a WebSocket was opened: the gateway may still hold it
    this.state = 'idle';
    this.exitCode = null;
    this.size = null;        // {cols, rows} last asked for
    this.ws = null;
    this.attempt = 0;        // failed tries since the last good attach
    this.busyTries = 0;
    this.timer = 0;
    this.stopped = false;
  }

  // start attaches; takeover evicts a client that holds the session.
  start({ takeover = false } = {}) {
    this.stopped = false;
    clearTimeout(this.timer);
    this.attempt = 0;
    this.busyTries = 0;
    this._attach(takeover);
  }

  // stop detaches for good (the page is leaving the terminal).
  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
    this._drop(1000, 'closed by the page');
  }

  // send writes stdin bytes; input typed while disconnected is dropped.
  send(bytes) {
    if (!this._open()) return false;
    const frame = new Uint8Array(bytes.length + 1);
    frame[0] = CH_STDIN;
    frame.set(bytes, 1);
    this.ws.send(frame);
    return true;
  }

  sendText(text) { return this.send(encoder.encode(text)); }

  // resize records the terminal's size and tells the server (now if
  // attached, else right after the next attach).
  resize(cols, rows) {
    this.size = { cols, rows };
    if (this._open()) this._json({ type: 'resize', cols, rows });
  }

  _open() { return this.ws && this.ws.readyState === WebSocket.OPEN && this.state === 'connected'; }

  _json(msg) { this.ws.send(JSON.stringify(msg)); }

  _setState(state, detail = {}) {
    this.state = state;
    this.onState(state, detail);
  }

  // _attach checks the session first: a WebSocket refused before the
  // upgrade (409 ALREADY_CONNECTED, 404) reaches a browser only as a
  // failed handshake with no status, so the status comes from GET /pty/{sid}.
  async _attach(takeover) {
    if (this.stopped) return;
    this._setState(this.everConnected ? 'reconnecting' : 'connecting', { attempt: this.attempt });
    let info;
    try {
      info = await this.api.sessionInfo(this.sessionId);
    } catch (err) {
      if (this.stopped) return;
      if (err.status === 404) return this._setState('gone');
      if (err.status === 401 || err.status === 403) return this._setState('denied', { message: err.message });
      return this._retry(); // the gateway is unreachable or failing: keep trying
    }
    if (this.stopped) return;
    if (info.attached && !takeover) {
      // Right after a drop (or a handshake cut short) the holder may be our
      // own dead connection, which the gateway has not noticed yet: retry a
      // few times before asking.
      if (this.dialed && this.busyTries < BUSY_RETRIES) {
        this.busyTries++;
        this._setState('busy', { retrying: true });
        return this._retry(true);
      }
      return this._setState('busy', { retrying: false });
    }
    this._dial(takeover);
  }

  _dial(takeover) {
    let url = this.api.wsURL(`/v1/sandboxes/${enc(this.sandboxId)}/pty/${enc(this.sessionId)}/ws`) +
      `?since=${this.received}`;
    if (takeover) url += '&takeover=1';
    let ws;
    try {
      // The lease travels only in the subprotocol, never in the URL.
      ws = new WebSocket(url, ['sandgate.lease.' + this.api.token]);
    } catch (err) {
      return this._setState('error', { message: 'cannot open a WebSocket: ' + err.message });
    }
    ws.binaryType = 'arraybuffer';
    this.ws = ws;
    this.dialed = true;
    let lastHeard = Date.now();
    const ping = setInterval(() => {
      if (ws !== this.ws) return clearInterval(ping);
      if (Date.now() - lastHeard > SILENT_AFTER_MS) {
        clearInterval(ping);
        this._lost(ws, 'the connection went silent');
        return;
      }
      if (ws.readyState === WebSocket.OPEN) this._json({ type: 'ping' });
    }, PING_EVERY_MS);
    ws.onmessage = (ev) => {
      if (ws !== this.ws) return;
      lastHeard = Date.now();
      this._message(ev.data);
    };
    ws.onclose = (ev) => {
      clearInterval(ping);
      if (ws !== this.ws) return;
      this.ws = null;
      this._closed(ev.code, ev.reason);
    };
  }

  _message(data) {
    if (typeof data === 'string') {
      let msg;
      try { msg = JSON.parse(data); } catch { return; }
      switch (msg.type) {
        case 'connected':
          this.attaches++;
          this.everConnected = true;
          this.attempt = 0;
          this.busyTries = 0;
          this._setState('connected');
          if (this.size) this._json({ type: 'resize', ...this.size });
          break;
        case 'exit':
          this.exitCode = msg.exit_code;
          break;
        case 'error':
          if (msg.code === 'SESSION_GONE') this.gone = true;
          this.onNotice(`${msg.code}: ${msg.error}`);
          break;
      }
      return;
    }
    const frame = new Uint8Array(data);
    if (frame.length === 0) return;
    switch (frame[0]) {
      case CH_OUTPUT:
      case CH_STDERR:
        this._output(this.received, frame.subarray(1));
        break;
      case CH_REPLAY: {
        if (frame.length < 9) return;
        const offset = Number(new DataView(data).getBigUint64(1));
        this._output(offset, frame.subarray(9));
        break;
      }
    }
  }

  // _output delivers the part of bytes (starting at absolute offset) the
  // page does not have yet.
  _output(offset, bytes) {
    if (offset > this.received) {
      this.onLost(offset - this.received, this.everConnected);
      this.received = offset;
    }
    const skip = this.received - offset;
    if (skip >= bytes.length) return;
    const fresh = skip > 0 ? bytes.subarray(skip) : bytes;
    this.received += fresh.length;
    this.onData(fresh);
  }

  _closed(code, reason) {
    if (this.stopped) return;
    if (code === CLOSE_TAKEN_OVER) return this._setState('taken-over');
    if (this.exitCode !== null) return this._setState('exited', { code: this.exitCode });
    if (this.gone) return this._setState('gone');
    // Anything else (a drop, 1001 shutdown, 1008 too slow, a refused
    // handshake): attach again from what we have.
    this._retry();
  }

  // _lost abandons a connection that stopped answering and re-attaches.
  _lost(ws, why) {
    if (ws !== this.ws) return;
    this._drop(4000, why);
    this._retry();
  }

  _drop(code, reason) {
    const ws = this.ws;
    this.ws = null;
    if (ws && ws.readyState <= WebSocket.OPEN) {
      try { ws.close(code, reason); } catch { /* already closing */ }
    }
  }

  _retry(busy = false) {
    if (this.stopped) return;
    const base = Math.min(BACKOFF_MAX_MS, BACKOFF_MIN_MS * 2 ** this.attempt);
    const delayMs = Math.round(base * (0.5 + Math.random() / 2));
    this.attempt++;
    if (!busy) this._setState('reconnecting', { attempt: this.attempt, delayMs });
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this._attach(false), delayMs);
  }
}

function enc(s) { return encodeURIComponent(s); }
