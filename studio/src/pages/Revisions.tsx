// A document's revisions (its previous versions, newest first: kept for the
// collections the database's revisions configuration names), a revision's JSON, and
// "revert to this revision" (POST .../revisions/revert, read_write; If-Match of the
// document's current etag, none when it is deleted).
import { useEffect, useState } from 'preact/hooks';
import { ConcurrencyError, type Revision } from 'kiln-client';
import { call, errorText, store } from '../api';
import { Confirm, ErrorBox } from '../components';

const SHOWN = 50;

export function Revisions(props: {
  db: string;
  id: string;
  /** The document's etag now (null: deleted or not loaded); a change reloads the list. */
  etag: string | null;
  mayWrite: boolean;
  onReverted: () => Promise<void>;
}) {
  const { db, id, etag } = props;
  const [revs, setRevs] = useState<Revision[] | null>(null);
  const [shown, setShown] = useState<string | null>(null);
  const [reverting, setReverting] = useState<Revision | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [status, setStatus] = useState<string | null>(null);

  const load = async () => {
    try {
      setRevs(await call(store(db).revisions(id, { limit: SHOWN })));
    } catch (e) {
      setError(errorText(e));
    }
  };
  useEffect(() => {
    load();
  }, [db, id, etag]);

  const revert = async (r: Revision) => {
    setReverting(null);
    setError(null);
    setStatus(null);
    try {
      const written = await call(store(db).revert(id, r.etag, etag ? { ifMatch: etag } : {}));
      await props.onReverted();
      setStatus(`reverted to ${r.etag}: the document's new etag is ${written}`);
    } catch (e) {
      setError(
        e instanceof ConcurrencyError
          ? 'The document changed on the server since you opened it (409): reload it and try again.'
          : errorText(e),
      );
    }
  };

  const open = revs?.find((r) => r.etag === shown);
  return (
    <div class="panel" data-testid="revisions">
      <h3>Revisions</h3>
      {revs === null ? (
        <p class="muted">loading…</p>
      ) : revs.length === 0 ? (
        <p class="muted" data-testid="no-revisions">
          No revisions. A database keeps them only for the collections its revisions configuration names (set
          with an admin key), from the next write on.
        </p>
      ) : (
        <table>
          <thead>
            <tr>
              <th>etag</th>
              <th>written</th>
              <th>replaced</th>
              <th>state</th>
              <th />
            </tr>
          </thead>
          <tbody>
            {revs.map((r) => (
              <tr key={r.etag} data-revision={r.etag} class={r.etag === shown ? 'selected' : ''}>
                <td class="mono">{r.etag}</td>
                <td>{new Date(r.last_modified).toLocaleString('en')}</td>
                <td class="muted">{new Date(r.replaced_at).toLocaleString('en')}</td>
                <td data-testid="revision-state">{r.deleted ? 'deleted' : 'written'}</td>
                <td class="actions">
                  <button type="button" class="small" onClick={() => setShown(r.etag === shown ? null : r.etag)} data-testid="view-revision">
                    {r.etag === shown ? 'Hide' : 'View'}
                  </button>
                  {props.mayWrite && r.document && (
                    <button type="button" class="small" onClick={() => setReverting(r)} data-testid="revert-revision">
                      Revert to this
                    </button>
                  )}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      {revs && revs.length >= SHOWN && <p class="muted">The newest {SHOWN} are shown.</p>}
      {open && (
        <pre class="code" data-testid="revision-json">
          {JSON.stringify(open.document, null, 2)}
        </pre>
      )}
      {status && (
        <p class="ok" data-testid="revision-status">
          {status}
        </p>
      )}
      <ErrorBox error={error} />
      {reverting && (
        <Confirm
          title={`Revert ${id} to ${reverting.etag}?`}
          confirmLabel="Revert"
          onConfirm={() => revert(reverting)}
          onCancel={() => setReverting(null)}
        >
          The revision is written as the document's new version (the version it replaces becomes a revision in turn).
        </Confirm>
      )}
    </div>
  );
}
