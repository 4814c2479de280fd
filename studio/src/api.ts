// The one door to the server's HTTP API. The API key (when the server runs with
// --auth) lives in sessionStorage and travels only in the Authorization header, never
// in a URL; the changes WebSocket carries it as a subprotocol (see openChanges).

const KEY_STORAGE = 'kiln.studio.apiKey';

export class ApiError extends Error {
  constructor(
    public status: number,
    public code: string,
    message: string,
    public body: any,
  ) {
    super(message);
  }
}

export interface Answer<T = any> {
  status: number;
  etag: string | null;
  body: T;
}

type AuthListener = () => void;
let authListeners: AuthListener[] = [];

export function apiKey(): string | null {
  return sessionStorage.getItem(KEY_STORAGE);
}

export function setApiKey(key: string | null): void {
  if (key) sessionStorage.setItem(KEY_STORAGE, key.trim());
  else sessionStorage.removeItem(KEY_STORAGE);
}

/** Called when the server answers 401: the studio then asks for a key. */
export function onAuthRequired(f: AuthListener): () => void {
  authListeners.push(f);
  return () => {
    authListeners = authListeners.filter((g) => g !== f);
  };
}

export async function api<T = any>(
  method: string,
  path: string,
  body?: unknown,
  headers: Record<string, string> = {},
): Promise<Answer<T>> {
  const h: Record<string, string> = { Accept: 'application/json', ...headers };
  const key = apiKey();
  if (key) h['Authorization'] = `Bearer ${key}`;
  let payload: string | undefined;
  if (body !== undefined) {
    payload = typeof body === 'string' ? body : JSON.stringify(body);
    h['Content-Type'] = 'application/json';
  }
  const r = await fetch(path, { method, headers: h, body: payload, cache: 'no-store' });
  const text = await r.text();
  let parsed: any = null;
  if (text) {
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = text;
    }
  }
  if (r.status === 401) authListeners.forEach((f) => f());
  if (!r.ok) {
    const code = parsed && typeof parsed === 'object' ? parsed.error ?? 'error' : 'error';
    const msg = parsed && typeof parsed === 'object' ? parsed.message ?? text : text || r.statusText;
    throw new ApiError(r.status, code, `${r.status} ${code}: ${msg}`, parsed);
  }
  return { status: r.status, etag: r.headers.get('ETag'), body: parsed as T };
}

export const enc = encodeURIComponent;

/** A document id in a URL path: each '/'-separated part encoded, the slashes kept,
 * except in an id containing '/attachments/', which the server would read as an
 * attachment's path: there every slash is encoded too. */
export function encId(id: string): string {
  return id.includes('/attachments/') ? enc(id) : id.split('/').map(enc).join('/');
}

export function docUrl(db: string, id: string): string {
  return `/dbs/${enc(db)}/docs/${encId(id)}`;
}

/** The changes feed over a WebSocket. Browsers cannot set headers on a WebSocket, so
 * the key is offered as the subprotocol `kiln.key.<key>` beside `kiln.changes.v1`,
 * which is the one the server selects (it never echoes the key). */
export function openChanges(db: string): WebSocket {
  const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
  const url = `${scheme}//${location.host}/dbs/${enc(db)}/changes/ws`;
  const key = apiKey();
  const protocols = ['kiln.changes.v1'];
  if (key) protocols.push(`kiln.key.${key}`);
  return new WebSocket(url, protocols);
}

export function formatBytes(n: number): string {
  if (!Number.isFinite(n)) return '–';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i++;
  }
  return `${n.toFixed(i === 0 ? 0 : 1)} ${units[i]}`;
}

export function errorText(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}
