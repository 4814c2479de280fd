import { useEffect, useMemo, useState } from 'preact/hooks';
import { ConcurrencyError, type AttachmentInfo } from 'kiln-client';
import { call, errorText, etagOf, mayWrite, store, useAccess } from '../api';
import { Attachments } from './Attachments';
import { Revisions } from './Revisions';
import { Confirm, ErrorBox } from '../components';
import { enc, href, navigate } from '../router';

interface Conflict {
  mine: string;
  /** The server's version now, or null when it was deleted there. */
  theirs: string | null;
  theirsEtag: string | null;
}

/** JSON.parse with the error as "line L, column C: message". */
function validate(text: string): string | null {
  try {
    const v = JSON.parse(text);
    if (v === null || typeof v !== 'object' || Array.isArray(v)) return 'a document must be a JSON object';
    return null;
  } catch (e) {
    const msg = errorText(e);
    const m = /position (\d+)/.exec(msg);
    if (m && !/line \d+/.test(msg)) {
      const before = text.slice(0, Number(m[1]));
      const line = before.split('\n').length;
      const col = Number(m[1]) - before.lastIndexOf('\n');
      return `line ${line}, column ${col}: ${msg}`;
    }
    return msg;
  }
}

/** Tab inserts two spaces; Shift+Tab still moves the focus out of the editor. */
function indentOnTab(e: KeyboardEvent) {
  if (e.key !== 'Tab' || e.shiftKey || e.ctrlKey || e.metaKey || e.altKey) return;
  const t = e.target as HTMLTextAreaElement;
  e.preventDefault();
  t.setRangeText('  ', t.selectionStart, t.selectionEnd, 'end');
  t.dispatchEvent(new Event('input', { bubbles: true }));
}

const pretty = (v: unknown) => JSON.stringify(v, null, 2);

/** Lines of `a` that `b` does not have, marked. */
function Lines({ text, other, testid }: { text: string; other: string; testid: string }) {
  const others = useMemo(() => new Set(other.split('\n')), [other]);
  return (
    <pre class="code" data-testid={testid}>
      {text.split('\n').map((l, i) => (
        <div key={i} class={others.has(l) ? '' : 'changed'}>
          {l || ' '}
        </div>
      ))}
    </pre>
  );
}

export function DocumentPage({ db, id }: { db: string; id: string | null }) {
  const creating = id === null;
  const [text, setText] = useState(creating ? '{\n  \n}' : '');
  const [etag, setEtag] = useState<string | null>(null);
  const [loaded, setLoaded] = useState(creating);
  const [error, setError] = useState<string | null>(null);
  const [status, setStatus] = useState<string | null>(null);
  const [conflict, setConflict] = useState<Conflict | null>(null);
  const [confirmDelete, setConfirmDelete] = useState(false);
  const [busy, setBusy] = useState(false);
  const [prefix, setPrefix] = useState(() => new URLSearchParams(location.search).get('prefix') ?? '');
  const [attachments, setAttachments] = useState<AttachmentInfo[]>([]);
  // The text as last loaded: an edit differs from it.
  const [loadedText, setLoadedText] = useState<string | null>(null);
  // The server's etag as last read (the editor's `etag` stays that of its text).
  const [serverEtag, setServerEtag] = useState<string | null>(null);
  const access = useAccess(db);
  const invalid = useMemo(() => (loaded ? validate(text) : null), [text, loaded]);

  /** Reads the document. `keepEdit`: after an attachment's upload or delete, an
   * unsaved edit stays in the editor (with the etag it was made on: its save then
   * meets the 409 view, which shows the server's version). */
  const load = async (keepEdit = false) => {
    if (creating) return;
    try {
      const doc = await call(store(db).get(id));
      if (doc === undefined) {
        setServerEtag(null);
        setLoaded(false);
        setAttachments([]);
        setError(`There is no document ${id} (404 document_not_found).`);
        return;
      }
      const meta = (doc['@metadata'] ?? {}) as { '@attachments'?: AttachmentInfo[] };
      setAttachments(meta['@attachments'] ?? []);
      setServerEtag(etagOf(doc));
      if (keepEdit && loaded && text !== loadedText) return;
      setError(null);
      setText(pretty(doc));
      setLoadedText(pretty(doc));
      setEtag(etagOf(doc));
      setLoaded(true);
    } catch (e) {
      setError(errorText(e));
    }
  };
  useEffect(() => {
    load();
  }, [db, id]);

  /** Writes `body` with If-Match `ifMatch` (or If-None-Match: * for null); a 409
   * (the client's ConcurrencyError) opens the conflict view. */
  const write = async (body: string, ifMatch: string | null) => {
    setBusy(true);
    setError(null);
    setStatus(null);
    try {
      const condition = ifMatch ? { ifMatch } : { ifNoneMatch: '*' as const };
      const written = await call(store(db).put(id as string, JSON.parse(body), condition));
      setConflict(null);
      setEtag(written);
      await load();
      setStatus(`saved (etag ${written})`);
    } catch (e) {
      if (e instanceof ConcurrencyError) {
        await showConflict(body);
      } else {
        setError(errorText(e));
      }
    } finally {
      setBusy(false);
    }
  };

  const showConflict = async (mine: string) => {
    try {
      // Undefined when it was deleted there.
      const theirs = await call(store(db).get(id as string));
      setConflict({ mine, theirs: theirs === undefined ? null : pretty(theirs), theirsEtag: etagOf(theirs) });
    } catch (e) {
      setError(errorText(e));
    }
  };

  const create = async () => {
    setBusy(true);
    setError(null);
    try {
      let p = prefix.trim() || 'docs/';
      if (!p.endsWith('/')) p += '/';
      // A session stores it under the prefix: the server generates the id.
      const doc = JSON.parse(text);
      const session = store(db).session();
      session.store(doc, p);
      await call(session.saveChanges());
      history.replaceState(null, '', href('db', db, 'doc', session.idOf(doc) as string));
      dispatchEvent(new PopStateEvent('popstate'));
    } catch (e) {
      setError(errorText(e));
    } finally {
      setBusy(false);
    }
  };

  const remove = async () => {
    setConfirmDelete(false);
    try {
      await call(store(db).delete(id as string, etag ? { ifMatch: etag } : {}));
      navigate(`db/${enc(db)}`);
    } catch (e) {
      if (e instanceof ConcurrencyError) setError('The document changed on the server since you opened it: reload before deleting.');
      else setError(errorText(e));
    }
  };

  const format = () => {
    if (!invalid) setText(pretty(JSON.parse(text)));
  };

  if (conflict) {
    return (
      <section data-testid="conflict">
        <h1>Conflict on {id}</h1>
        <p>
          Somebody else changed this document after you opened it (your save was refused with 409). Choose the version to
          keep.
        </p>
        <div class="columns">
          <div>
            <h3>Your version</h3>
            <Lines text={conflict.mine} other={conflict.theirs ?? ''} testid="conflict-mine" />
            <button type="button" disabled={busy} onClick={() => write(conflict.mine, conflict.theirsEtag)} data-testid="keep-mine">
              {conflict.theirs === null ? 'Recreate it with my version' : 'Keep my version (overwrite theirs)'}
            </button>
          </div>
          <div>
            <h3>
              Server's version {conflict.theirsEtag && <span class="mono muted">{conflict.theirsEtag}</span>}
            </h3>
            {conflict.theirs === null ? (
              <p class="muted">It was deleted on the server.</p>
            ) : (
              <Lines text={conflict.theirs} other={conflict.mine} testid="conflict-theirs" />
            )}
            <button
              type="button"
              disabled={busy}
              data-testid="take-theirs"
              onClick={() => {
                if (conflict.theirs === null) {
                  navigate(`db/${enc(db)}`);
                  return;
                }
                setText(conflict.theirs);
                setEtag(conflict.theirsEtag);
                setConflict(null);
                setStatus('took the server’s version');
              }}
            >
              {conflict.theirs === null ? 'Accept the delete' : 'Take the server’s version'}
            </button>
          </div>
        </div>
        <ErrorBox error={error} />
      </section>
    );
  }

  return (
    <section>
      <p>
        <a href={href('db', db)}>← {db}</a>
      </p>
      <h1>{creating ? 'New document' : id}</h1>
      {creating ? (
        <div class="row">
          <label>
            id prefix (the server appends a number){' '}
            <input value={prefix} onInput={(e) => setPrefix((e.target as HTMLInputElement).value)} data-testid="prefix-for-new" placeholder="users/" />
          </label>
        </div>
      ) : (
        <p class="muted mono" data-testid="etag">
          etag {etag ?? '…'}
        </p>
      )}
      <textarea
        class="editor"
        spellcheck={false}
        value={text}
        disabled={!loaded}
        onInput={(e) => setText((e.target as HTMLTextAreaElement).value)}
        onKeyDown={indentOnTab}
        data-testid="editor"
      />
      <div class={'validation ' + (invalid ? 'bad' : 'good')} data-testid="validation">
        {loaded ? (invalid ? `Invalid: ${invalid}` : 'Valid JSON object') : 'loading…'}
      </div>
      <div class="row">
        {creating ? (
          <button type="button" disabled={!!invalid || busy} onClick={create} data-testid="create-doc">
            Create
          </button>
        ) : (
          <button type="button" disabled={!!invalid || busy || !loaded} onClick={() => write(text, etag)} data-testid="save">
            Save
          </button>
        )}
        <button type="button" disabled={!!invalid} onClick={format}>
          Format
        </button>
        {!creating && (
          <button type="button" onClick={() => load()}>
            Reload
          </button>
        )}
        {!creating && (access === null || mayWrite(access)) && (
          <button type="button" class="danger" onClick={() => setConfirmDelete(true)} data-testid="delete-doc">
            Delete
          </button>
        )}
        {status && (
          <span class="ok" data-testid="status">
            {status}
          </span>
        )}
      </div>
      <ErrorBox error={error} />
      {!creating && loaded && (
        <Attachments
          db={db}
          id={id}
          etag={serverEtag}
          list={attachments}
          mayWrite={mayWrite(access)}
          onChanged={() => load(true)}
        />
      )}
      {!creating && <Revisions db={db} id={id} etag={serverEtag} mayWrite={mayWrite(access)} onReverted={() => load()} />}
      {confirmDelete && (
        <Confirm title={`Delete ${id}?`} confirmLabel="Delete document" onConfirm={remove} onCancel={() => setConfirmDelete(false)}>
          The document is removed (its delete stays in the changes feed as a tombstone).
        </Confirm>
      )}
    </section>
  );
}
