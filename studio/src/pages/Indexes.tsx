import { useState } from 'preact/hooks';
import type { IndexInfo } from 'kiln-client';
import { call, errorText, store } from '../api';
import { Confirm, ErrorBox, usePoll } from '../components';

export function IndexesPage({ db }: { db: string }) {
  const [indexes, setIndexes] = useState<IndexInfo[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [name, setName] = useState('');
  const [collection, setCollection] = useState('');
  const [fields, setFields] = useState('');
  const [deleting, setDeleting] = useState<string | null>(null);

  const load = async () => {
    try {
      setIndexes(await call(store(db).indexes()));
    } catch (e) {
      setError(errorText(e));
    }
  };
  usePoll(load, 1000, [db]);

  const create = async (e: Event) => {
    e.preventDefault();
    setError(null);
    try {
      const body = {
        collection: collection.trim() || null,
        fields: fields
          .split(',')
          .map((f) => f.trim())
          .filter(Boolean),
      };
      await call(store(db).defineIndex(name.trim(), body));
      setName('');
      setFields('');
      await load();
    } catch (err) {
      setError(errorText(err));
    }
  };
  const act = async (f: Promise<unknown>) => {
    try {
      await call(f);
      await load();
    } catch (e) {
      setError(errorText(e));
    }
  };

  return (
    <section>
      <h1>Indexes of {db}</h1>
      <form class="row" onSubmit={create}>
        <input placeholder="name" data-testid="index-name" value={name} onInput={(e) => setName((e.target as HTMLInputElement).value)} />
        <input placeholder="collection (empty: all)" data-testid="index-collection" value={collection} onInput={(e) => setCollection((e.target as HTMLInputElement).value)} />
        <input placeholder="fields, e.g. age, address.city" data-testid="index-fields" value={fields} onInput={(e) => setFields((e.target as HTMLInputElement).value)} />
        <button type="submit" disabled={!name.trim() || !fields.trim()} data-testid="define-index">
          Define index
        </button>
      </form>
      <ErrorBox error={error} />
      {indexes === null ? (
        <p class="muted">loading…</p>
      ) : indexes.length === 0 ? (
        <p class="muted">No indexes. Queries create auto indexes as they need them.</p>
      ) : (
        <table data-testid="indexes">
          <thead>
            <tr>
              <th>name</th>
              <th>collection</th>
              <th>fields</th>
              <th>state</th>
              <th class="num">lag (docs)</th>
              <th class="num">entries</th>
              <th class="num">batch size</th>
              <th class="num">docs/s</th>
              <th class="num">errors</th>
              <th>indexed up to</th>
              <th />
            </tr>
          </thead>
          <tbody>
            {indexes.map((i) => (
              <tr key={i.name} data-index={i.name}>
                <td>
                  {i.name} {i.auto && <span class="tag">auto</span>}
                </td>
                <td>{i.collection ?? 'all'}</td>
                <td class="mono">{i.fields.map((f) => f.path + (f.case_insensitive ? ' (ci)' : '')).join(', ')}</td>
                <td>{i.stale ? <span class="tag warn">stale</span> : <span class="tag good">current</span>}</td>
                <td class="num">{i.docs_behind.toLocaleString('en')}</td>
                <td class="num" data-testid="entries">
                  {i.entries.toLocaleString('en')}
                </td>
                <td class="num">{i.batch_size.toLocaleString('en')}</td>
                <td class="num">{i.docs_per_sec.toLocaleString('en')}</td>
                <td class="num" title={i.error_samples.map((s) => JSON.stringify(s)).join('\n')}>
                  {i.errors}
                </td>
                <td class="mono muted">
                  {i.last_indexed_etag ?? '–'} / {i.database_etag ?? '–'}
                </td>
                <td class="actions">
                  <button type="button" class="small" onClick={() => act(store(db).resetIndex(i.name))}>
                    Rebuild
                  </button>
                  <button type="button" class="small danger" onClick={() => setDeleting(i.name)}>
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
          title={`Delete index ${deleting}?`}
          confirmLabel="Delete index"
          onConfirm={() => {
            const n = deleting;
            setDeleting(null);
            act(store(db).deleteIndex(n));
          }}
          onCancel={() => setDeleting(null)}
        >
          Queries that used it fall back to another index or create an auto index.
        </Confirm>
      )}
    </section>
  );
}
