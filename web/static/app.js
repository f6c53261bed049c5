// app.js: the sandgate page. Two views, chosen by the URL fragment:
//   #/                                   the sandbox list
//   #/sandboxes/{id}[?lease=…][&session=…][&takeover=1]
//                                        a terminal on that sandbox
// The lease stays in the fragment (never sent to the server in a URL) and
// is then kept in this browser's storage, keyed by sandbox.
import { Terminal } from './vendor/xterm.mjs';
import { FitAddon } from './vendor/addon-fit.mjs';
import { PtyConnection } from './pty.js';

const $ = (sel) => document.querySelector(sel);

// ---- storage: the API key and the leases this browser holds ----

const store = {
  get(key, fallback) {
    try { return JSON.parse(localStorage.getItem('sandgate.' + key)) ?? fallback; } catch { return fallback; }
  },
  set(key, value) {
    try { localStorage.setItem('sandgate.' + key, JSON.stringify(value)); } catch { /* storage off: keep in memory only */ }
  },
};
let apiKey = store.get('apiKey', '');
const leases = store.get('leases', {});
function saveLease(id, token) { leases[id] = token; store.set('leases', leases); }
function forgetLease(id) { delete leases[id]; store.set('leases', leases); }

// credential returns what opens sandbox id: its lease, else the API key
// (which works on every sandbox it created).
function credential(id) {
  if (leases[id]) return { token: leases[id], header: ['X-Sandbox-Lease', leases[id]] };
  if (apiKey) return { token: apiKey, header: ['Authorization', 'Bearer ' + apiKey] };
  return null;
}

// ---- REST ----

class ApiError extends Error {
  constructor(status, message, code) { super(message); this.status = status; this.code = code; }
}

async function api(method, path, { body, header } = {}) {
  const headers = {};
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  if (header) headers[header[0]] = header[1];
  let res;
  try {
    res = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (err) {
    throw new ApiError(0, 'the gateway is unreachable');
  }
  const isJSON = (res.headers.get('Content-Type') || '').includes('json');
  const data = isJSON ? await res.json() : await res.text();
  if (!res.ok) {
    throw new ApiError(res.status, (isJSON && (data.detail || data.title)) || `${res.status} ${res.statusText}`, isJSON ? data.code : '');
  }
  return data;
}

const keyHeader = () => (apiKey ? ['Authorization', 'Bearer ' + apiKey] : undefined);

function wsURL(path) {
  return (location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + path;
}

// ---- the list view ----

function showMsg(el, text, kind = '') {
  el.textContent = text;
  el.className = 'msg' + (kind ? ' ' + kind : '');
  el.hidden = !text;
}

function expiry(info) {
  if (!info.expires_at) return 'never';
  const s = Math.round((Date.parse(info.expires_at) - Date.now()) / 1000);
  if (s <= 0) return 'expired';
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
  return 'in ' + (h ? `${h}h ${m}m` : m ? `${m}m ${s % 60}s` : `${s}s`);
}

function button(label, onClick, cls = '') {
  const b = document.createElement('button');
  b.type = 'button';
  b.textContent = label;
  if (cls) b.className = cls;
  b.addEventListener('click', onClick);
  return b;
}

function cell(tr, cls, ...children) {
  const td = document.createElement('td');
  if (cls) td.className = cls;
  td.append(...children);
  tr.append(td);
  return td;
}

let listTimer = 0;

async function renderList() {
  clearTimeout(listTimer);
  const msg = $('#list-msg');
  let list;
  try {
    list = (await api('GET', '/v1/sandboxes', { header: keyHeader() })).sandboxes;
  } catch (err) {
    showMsg(msg, 'Cannot list sandboxes: ' + err.message + (err.status === 401 ? ' (set the API key above)' : ''), 'error');
    return;
  }
  if (location.hash.startsWith('#/sandboxes/')) return; // the user moved on
  const tbody = $('#sandboxes tbody');
  tbody.replaceChildren();
  for (const info of list) tbody.append(sandboxRow(info));
  if (!list.length) showMsg(msg, 'No sandboxes yet.');
  else if (msg.textContent.startsWith('No sandboxes') || msg.classList.contains('error')) showMsg(msg, '');
  listTimer = setTimeout(renderList, 10000);
}

function sandboxRow(info) {
  const id = info.sandbox_id;
  const tr = document.createElement('tr');
  tr.dataset.id = id;
  const code = document.createElement('code');
  code.textContent = id;
  const idCell = cell(tr, 'id', code);
  const state = document.createElement('span');
  state.className = 'state-' + info.status;
  state.textContent = info.status;
  cell(tr, 'state', state);
  const exp = cell(tr, 'expires', expiry(info));
  if (info.expires_at) exp.title = new Date(info.expires_at).toLocaleString();

  const actions = cell(tr, 'actions');
  if (info.status === 'stopped') return tr;
  if (!credential(id)) {
    actions.append(button('Use a lease…', () => {
      const tok = prompt(`Lease token for ${id}:`);
      if (tok) { saveLease(id, tok.trim()); renderList(); }
    }));
    return tr;
  }
  actions.append(
    button('Terminal', () => { location.hash = `#/sandboxes/${id}`; }, 'open-terminal'),
    button('Sessions', () => toggleSessions(idCell, id)),
    button('Delete', (ev) => deleteSandbox(ev.target, id), 'danger'),
  );
  return tr;
}

async function toggleSessions(td, id) {
  const old = td.querySelector('ul.sessions');
  if (old) return old.remove();
  const ul = document.createElement('ul');
  ul.className = 'sessions';
  td.append(ul);
  try {
    const { sessions } = await api('GET', `/v1/sandboxes/${id}/pty`, { header: credential(id).header });
    if (!sessions.length) ul.append(Object.assign(document.createElement('li'), { textContent: 'no terminal sessions' }));
    for (const s of sessions) {
      const li = document.createElement('li');
      const a = document.createElement('a');
      a.href = `#/sandboxes/${id}?session=${encodeURIComponent(s.session_id)}`;
      a.textContent = s.session_id;
      const state = s.running ? 'running' : `exited ${s.exit_code}`;
      li.append(a, ` (${state}${s.attached ? ', attached elsewhere' : ''})`);
      ul.append(li);
    }
  } catch (err) {
    ul.append(Object.assign(document.createElement('li'), { textContent: err.message }));
  }
}

async function deleteSandbox(btn, id) {
  if (btn.dataset.armed !== '1') {
    btn.dataset.armed = '1';
    btn.textContent = 'Really delete?';
    return;
  }
  btn.disabled = true;
  try {
    await api('DELETE', `/v1/sandboxes/${id}`, { header: credential(id).header });
    forgetLease(id);
    showMsg($('#list-msg'), `Deleted ${id}.`);
  } catch (err) {
    showMsg($('#list-msg'), `Cannot delete ${id}: ${err.message}`, 'error');
  }
  renderList();
}

async function createSandbox(ev) {
  ev.preventDefault();
  const image = $('#create-image').value.trim();
  const btn = $('#btn-create');
  btn.disabled = true;
  showMsg($('#list-msg'), 'Creating a sandbox…');
  try {
    const ref = await api('POST', '/v1/sandboxes', { body: image ? { image } : {}, header: keyHeader() });
    saveLease(ref.sandbox_id, ref.lease_token);
    showMsg($('#list-msg'), `Created ${ref.sandbox_id}.`);
  } catch (err) {
    showMsg($('#list-msg'), 'Cannot create a sandbox: ' + err.message, 'error');
  } finally {
    btn.disabled = false;
  }
  renderList();
}

// ---- the terminal view ----

let view = null; // the open terminal: {term, conn, dispose}

const STATE_TEXT = {
  idle: () => '',
  connecting: () => 'connecting…',
  connected: () => 'connected',
  reconnecting: (d) => (d.delayMs !== undefined ? `disconnected; reconnecting in ${(d.delayMs / 1000).toFixed(1)} s (try ${d.attempt})` : 'reconnecting…'),
  busy: (d) => 'another client is attached to this session' + (d.retrying ? '; retrying…' : ''),
  'taken-over': () => 'taken over by another client',
  exited: (d) => `process exited with code ${d.code}`,
  gone: () => 'the session is gone',
  denied: (d) => 'access denied: ' + (d.message || 'the lease was refused'),
  error: (d) => 'error: ' + d.message,
};

function setConnState(state, detail) {
  const el = $('#conn-state');
  el.dataset.state = state;
  el.textContent = STATE_TEXT[state](detail);
  $('#btn-takeover').hidden = !(state === 'busy' || state === 'taken-over');
  $('#btn-retry').hidden = !(state === 'gone' || state === 'denied' || state === 'error');
}

function closeTerminal() {
  if (view) view.dispose();
  view = null;
}

async function openTerminal(id, params) {
  closeTerminal();
  const notice = $('#term-notice');
  showMsg(notice, '');
  $('#term-title').textContent = id;
  if (params.has('lease')) {
    saveLease(id, params.get('lease'));
    params.delete('lease'); // out of the address bar, into this browser's storage
    history.replaceState(null, '', `#/sandboxes/${id}` + (params.size ? '?' + params : ''));
  }
  const cred = credential(id);
  setConnState('idle', {});
  if (!cred) {
    showMsg(notice, `No lease for ${id} in this browser: open #/sandboxes/${id}?lease=TOKEN, or set the API key that created it.`, 'error');
    return;
  }

  const narrow = window.matchMedia('(max-width: 640px)').matches;
  const term = new Terminal({
    cursorBlink: true,
    fontSize: narrow ? 12 : 14,
    fontFamily: 'ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace',
    scrollback: 10000,
    theme: { background: '#000000' },
  });
  const fit = new FitAddon();
  term.loadAddon(fit);
  const el = $('#terminal');
  el.replaceChildren();
  term.open(el);
  fit.fit();

  const dims = () => ({ cols: term.cols, rows: term.rows });
  const current = { term, conn: null, disposed: false };
  view = current;
  current.dispose = () => {
    current.disposed = true;
    observer.disconnect();
    if (current.conn) current.conn.stop();
    term.dispose();
  };
  let fitQueued = false;
  const observer = new ResizeObserver(() => {
    if (fitQueued) return;
    fitQueued = true;
    requestAnimationFrame(() => { fitQueued = false; if (!current.disposed) fit.fit(); });
  });
  observer.observe(el);

  let sid = params.get('session');
  if (!sid) {
    setConnState('connecting', {});
    try {
      sid = (await api('POST', `/v1/sandboxes/${id}/pty`, { body: dims(), header: cred.header })).session_id;
    } catch (err) {
      if (!current.disposed) setConnState('error', { message: 'cannot start a shell: ' + err.message });
      return;
    }
    if (current.disposed) return;
    history.replaceState(null, '', `#/sandboxes/${id}?session=${encodeURIComponent(sid)}`);
  }
  $('#term-title').textContent = `${id} · ${sid}`;

  const conn = new PtyConnection({
    api: {
      token: cred.token,
      wsURL,
      sessionInfo: (s) => api('GET', `/v1/sandboxes/${id}/pty/${encodeURIComponent(s)}`, { header: cred.header }),
    },
    sandboxId: id,
    sessionId: sid,
    onData: (bytes) => term.write(bytes),
    onState: (state, detail) => { if (!current.disposed) setConnState(state, detail); },
    onLost: (n, dueToDrop) => {
      showMsg(notice, dueToDrop
        ? `${n} bytes of output were lost while disconnected: the gateway no longer retained them.`
        : `Earlier output (${n} bytes) is no longer retained by the gateway.`, 'warn');
    },
    onNotice: (text) => showMsg(notice, text, 'warn'),
  });
  current.conn = conn;
  conn.resize(term.cols, term.rows);
  term.onResize(({ cols, rows }) => conn.resize(cols, rows));
  term.onData((data) => conn.sendText(data));
  // Mouse reports in legacy encodings are bytes, not text.
  term.onBinary((data) => conn.send(Uint8Array.from(data, (c) => c.charCodeAt(0) & 0xff)));
  term.attachCustomKeyEventHandler((e) => {
    if (e.type !== 'keydown' || !e.ctrlKey || !e.shiftKey) return true;
    if (e.code === 'KeyC') { copySelection(); return false; }
    if (e.code === 'KeyV') return false; // the browser's paste event reaches xterm
    return true;
  });
  conn.start({ takeover: params.get('takeover') === '1' });
  term.focus();
  window.sandgate = { term, conn }; // for tests and the curious, in the devtools
}

async function copySelection() {
  if (!view) return;
  const text = view.term.getSelection();
  if (!text) return;
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    showMsg($('#term-notice'), 'The clipboard is not available here: use the browser’s copy (Ctrl+Insert, or the context menu).', 'warn');
  }
}

async function pasteClipboard() {
  if (!view) return;
  try {
    view.term.paste(await navigator.clipboard.readText());
  } catch {
    showMsg($('#term-notice'), 'The clipboard is not available here: use Ctrl+Shift+V or the browser’s paste.', 'warn');
  }
  view.term.focus();
}

// ---- routing and wiring ----

function route() {
  const m = location.hash.match(/^#\/sandboxes\/([^/?]+)(?:\?(.*))?$/);
  $('#list-view').hidden = !!m;
  $('#term-view').hidden = !m;
  if (m) {
    clearTimeout(listTimer);
    openTerminal(decodeURIComponent(m[1]), new URLSearchParams(m[2] || ''));
  } else {
    closeTerminal();
    renderList();
  }
}

$('#api-key').value = apiKey;
$('#key-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  apiKey = $('#api-key').value.trim();
  store.set('apiKey', apiKey);
  if ($('#term-view').hidden) renderList();
});
$('#create-form').addEventListener('submit', createSandbox);
$('#btn-refresh').addEventListener('click', () => renderList());
$('#btn-takeover').addEventListener('click', () => view && view.conn && view.conn.start({ takeover: true }));
$('#btn-retry').addEventListener('click', () => view && view.conn && view.conn.start());
$('#btn-copy').addEventListener('click', copySelection);
$('#btn-paste').addEventListener('click', pasteClipboard);
$('#btn-newshell').addEventListener('click', () => {
  const m = location.hash.match(/^#\/sandboxes\/([^/?]+)/);
  if (!m) return;
  const target = `#/sandboxes/${m[1]}`;
  if (location.hash === target) route(); // no hashchange for the same fragment
  else location.hash = target;
});
window.addEventListener('hashchange', route);
window.addEventListener('online', () => {
  if (view && view.conn && view.conn.state === 'reconnecting') view.conn.start();
});
route();
