// The studio's requests all go through kiln-client (clients/typescript, bundled from
// its sources: see vite.config.ts): one DocumentStore per database, made with the API
// key of the moment. The key (when the server runs with --auth) lives in
// sessionStorage and travels only in the Authorization header, never in a URL; the
// client's changes feed carries it as the WebSocket subprotocol `kiln.key.<key>`.

import { useEffect, useState } from 'preact/hooks';
import { accessTo, AuthenticationError, DocumentStore, KilnError, type Caller, type DatabaseGrant } from 'kiln-client';

const KEY_STORAGE = 'kiln.studio.apiKey';

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

let stores = new Map<string, DocumentStore>();
let storesKey: string | null = null;

/** The client for database `db`, on the server that serves the studio, with the
 * current key (a new key, after a sign-in or out, makes new stores). */
export function store(db: string): DocumentStore {
  const key = apiKey();
  if (key !== storesKey) {
    for (const s of stores.values()) void s.close();
    stores = new Map();
    storesKey = key;
  }
  let s = stores.get(db);
  if (!s) {
    s = new DocumentStore(location.origin, db, {
      apiKey: key ?? undefined,
      // A query may wait up to 30 s for its index (wait_for_non_stale_ms).
      timeoutMs: 60_000,
      cacheSizeBytes: 8 << 20,
    });
    stores.set(db, s);
  }
  return s;
}

/** For the server-wide calls (databaseNames, serverStats, clusterStatus), which
 * answer the same whatever the store's database: this name is never sent. */
export const server = () => store('studio');

/** Waits for a client call; a 401 (AuthenticationError) makes the studio ask for a key. */
export async function call<T>(p: Promise<T>): Promise<T> {
  try {
    return await p;
  } catch (e) {
    if (e instanceof AuthenticationError) authListeners.forEach((f) => f());
    throw e;
  }
}

/** A document's etag, from its `@metadata`. */
export function etagOf(doc: Record<string, unknown> | undefined): string | null {
  const m = doc?.['@metadata'] as Record<string, unknown> | undefined;
  return typeof m?.['@etag'] === 'string' ? m['@etag'] : null;
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

/** An error as shown: a client error (KilnError) with its HTTP status and code
 * (`400 invalid_query: ...`; the client's own, such as `connection_failed`, have no
 * status), else the message. Not the class's name: minified, it is a letter or two. */
export function errorText(e: unknown): string {
  if (e instanceof KilnError) return `${e.status ? `${e.status} ` : ''}${e.code}: ${e.message}`;
  return e instanceof Error ? e.message : String(e);
}

let callerFor: string | null | undefined;
let callerAnswer: Promise<Caller> | null = null;

/** Who the current key is (GET /whoami, asked once per key). */
export function whoami(): Promise<Caller> {
  const key = apiKey();
  if (callerAnswer === null || callerFor !== key) {
    callerFor = key;
    callerAnswer = call(server().whoami());
    callerAnswer.catch(() => (callerAnswer = null));
  }
  return callerAnswer;
}

export type Access = DatabaseGrant['access'];

/** The caller's access to `db` (`read`, `read_write`, `admin`), or null while unknown
 * or when it has none: pages offer an action only when the access allows it (the
 * server checks it anyway). */
export function useAccess(db: string): Access | null {
  const [access, setAccess] = useState<Access | null>(null);
  useEffect(() => {
    whoami()
      .then((c) => setAccess(accessTo(c, db)))
      .catch(() => setAccess(null));
  }, [db]);
  return access;
}

export const mayWrite = (a: Access | null) => a === 'read_write' || a === 'admin';
