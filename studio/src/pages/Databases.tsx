import { useState } from 'preact/hooks';
import { accessTo, ForbiddenError, type Caller } from 'kiln-client';
import { call, errorText, formatBytes, server, store } from '../api';
import { Confirm, ErrorBox, usePoll } from '../components';
import { href } from '../router';

/** What the list shows of a database. */
interface Row {
  name: string;
  documents: number;
  data_file_bytes: number;
}

/** The server-wide figures need an operator key; a key for some databases gets each
 * of its databases' own figures instead (the server lists only those it may read). */
async function databaseRows(): Promise<Row[]> {
  try {
    return (await call(server().serverStats())).databases;
  } catch (e) {
    if (!(e instanceof ForbiddenError)) throw e;
  }
  const names = await call(server().databaseNames());
  return Promise.all(
    names.map(async (name) => {
      const s = await call(store(name).databaseStats());
      const engine = (s.engine ?? {}) as { data_file_bytes?: number };
      return { name, documents: Number(s.documents ?? 0), data_file_bytes: Number(engine.data_file_bytes ?? NaN) };
    }),
  );
}

export function Databases() {
  const [rows, setRows] = useState<Row[] | null>(null);
  const [caller, setCaller] = useState<Caller | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [name, setName] = useState('');
  const [deleting, setDeleting] = useState<Row | null>(null);

  const load = async () => {
    try {
      if (caller === null) setCaller(await call(server().whoami()));
      const list = await databaseRows();
      setRows([...list].sort((a, b) => a.name.localeCompare(b.name)));
    } catch (e) {
      setError(errorText(e));
    }
  };
  // Only what the caller may do is offered (the server checks it anyway).
  const mayAdmin = (db: string) => caller === null || accessTo(caller, db) === 'admin';
  const mayCreate =
    caller === null ||
    caller.clearance === 'operator' ||
    caller.clearance.databases.some((g) => g.access === 'admin');
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
  const remove = async (row: Row) => {
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
      {caller?.authenticated && (
        <p class="muted" data-testid="caller">
          Signed in as {caller.name} ({caller.kind}):{' '}
          {caller.clearance === 'operator'
            ? 'operator'
            : caller.clearance.databases.map((g) => `${g.database}: ${g.access}`).join(', ') || 'no database'}
        </p>
      )}
      {mayCreate && (
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
      )}
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
                  {mayAdmin(r.name) && (
                    <button type="button" class="danger small" onClick={() => setDeleting(r)} data-testid="delete-db">
                      Delete
                    </button>
                  )}
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
