import { useState } from 'preact/hooks';
import type { DatabaseFigures } from 'kiln-client';
import { call, errorText, formatBytes, server, store } from '../api';
import { Confirm, ErrorBox, usePoll } from '../components';
import { href } from '../router';

export function Databases() {
  const [rows, setRows] = useState<DatabaseFigures[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [name, setName] = useState('');
  const [deleting, setDeleting] = useState<DatabaseFigures | null>(null);

  const load = async () => {
    try {
      const stats = await call(server().serverStats());
      setRows([...stats.databases].sort((a, b) => a.name.localeCompare(b.name)));
    } catch (e) {
      setError(errorText(e));
    }
  };
  usePoll(load, 5000, []);

  const create = async (e: Event) => {
    e.preventDefault();
    setError(null);
    try {
      await call(store(name.trim()).createDatabase({ existOk: false }));
      setName('');
      await load();
    } catch (err) {
      setError(errorText(err));
    }
  };
  const remove = async (row: DatabaseFigures) => {
    setDeleting(null);
    try {
      await call(store(row.name).deleteDatabase());
      await load();
    } catch (err) {
      setError(errorText(err));
    }
  };

  return (
    <section>
      <h1>Databases</h1>
      <form class="row" onSubmit={create}>
        <input
          placeholder="new database name"
          value={name}
          onInput={(e) => setName((e.target as HTMLInputElement).value)}
          data-testid="new-db-name"
        />
        <button type="submit" disabled={!name.trim()} data-testid="create-db">
          Create database
        </button>
      </form>
      <ErrorBox error={error} />
      {rows === null ? (
        <p class="muted">loading…</p>
      ) : rows.length === 0 ? (
        <p class="muted">No databases yet.</p>
      ) : (
        <table data-testid="databases">
          <thead>
            <tr>
              <th>name</th>
              <th class="num">documents</th>
              <th class="num">data file</th>
              <th />
            </tr>
          </thead>
          <tbody>
            {rows.map((r) => (
              <tr key={r.name} data-db={r.name}>
                <td>
                  <a href={href('db', r.name)}>{r.name}</a>
                </td>
                <td class="num" data-testid="doc-count">
                  {r.documents.toLocaleString('en')}
                </td>
                <td class="num">{formatBytes(r.data_file_bytes)}</td>
                <td class="actions">
                  <a href={href('db', r.name, 'query')}>query</a>
                  <button type="button" class="danger small" onClick={() => setDeleting(r)} data-testid="delete-db">
                    Delete
                  </button>
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      {deleting && (
        <Confirm
          title={`Delete database “${deleting.name}”?`}
          confirmLabel="Delete database"
          onConfirm={() => remove(deleting)}
          onCancel={() => setDeleting(null)}
        >
          Its {deleting.documents.toLocaleString('en')} documents, indexes and files are removed. This cannot be
          undone.
        </Confirm>
      )}
    </section>
  );
}
