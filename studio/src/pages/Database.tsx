import { useEffect, useState } from 'preact/hooks';
import type { CollectionInfo } from 'kiln-client';
import { call, errorText, store } from '../api';
import { ErrorBox, Pager } from '../components';
import { enc, href, navigate } from '../router';

type Mode = { kind: 'collection'; name: string } | { kind: 'prefix'; prefix: string };

const PAGE_SIZE = 25;

function preview(doc: any): string {
  const { ['@metadata']: _m, ...rest } = doc ?? {};
  const s = JSON.stringify(rest);
  return s.length > 120 ? s.slice(0, 117) + '…' : s;
}

export function DatabasePage({ db }: { db: string }) {
  const [collections, setCollections] = useState<CollectionInfo[]>([]);
  const [mode, setMode] = useState<Mode>({ kind: 'prefix', prefix: '' });
  const [prefixInput, setPrefixInput] = useState('');
  // cursors[i] is what page i continues after (undefined for the first page).
  const [cursors, setCursors] = useState<(string | undefined)[]>([undefined]);
  const [docs, setDocs] = useState<any[] | null>(null);
  const [next, setNext] = useState<string | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [newPrefix, setNewPrefix] = useState('');
  const page = cursors.length - 1;

  useEffect(() => {
    call(store(db).collections())
      .then(setCollections)
      .catch((e) => setError(errorText(e)));
  }, [db]);

  useEffect(() => {
    // By collection: etag order, continuing after an etag; by id prefix: id order,
    // continuing after an id. Either way `after` is the previous page's `next`.
    const after = cursors[cursors.length - 1];
    const which = mode.kind === 'collection' ? { collection: mode.name } : { prefix: mode.prefix };
    setDocs(null);
    call(store(db).listDocuments({ ...which, after, pageSize: PAGE_SIZE }))
      .then((page) => {
        setDocs(page.results);
        setNext(page.next);
        setError(null);
      })
      .catch((e) => setError(errorText(e)));
  }, [db, mode, cursors]);

  const choose = (m: Mode) => {
    setMode(m);
    setCursors([undefined]);
  };

  return (
    <section class="split">
      <aside>
        <h3>Collections</h3>
        <ul class="plain" data-testid="collections">
          <li>
            <button
              type="button"
              class={'link' + (mode.kind === 'prefix' && mode.prefix === '' ? ' active' : '')}
              onClick={() => choose({ kind: 'prefix', prefix: '' })}
            >
              all documents
            </button>
          </li>
          {collections.map((c) => (
            <li key={c.name}>
              <button
                type="button"
                class={'link' + (mode.kind === 'collection' && mode.name === c.name ? ' active' : '')}
                onClick={() => choose({ kind: 'collection', name: c.name })}
              >
                {c.name}
              </button>{' '}
              <span class="muted">{c.documents.toLocaleString('en')}</span>
            </li>
          ))}
        </ul>
      </aside>
      <div>
        <h1>{db}</h1>
        <p>
          <a href={href('db', db, 'subscriptions')} data-testid="subscriptions-link">
            Data subscriptions →
          </a>
        </p>
        <div class="row">
          <form
            class="row"
            onSubmit={(e) => {
              e.preventDefault();
              choose({ kind: 'prefix', prefix: prefixInput });
            }}
          >
            <input
              placeholder="id prefix, e.g. users/"
              value={prefixInput}
              onInput={(e) => setPrefixInput((e.target as HTMLInputElement).value)}
              data-testid="prefix"
            />
            <button type="submit">Filter by id prefix</button>
          </form>
          <form
            class="row"
            onSubmit={(e) => {
              e.preventDefault();
              navigate(`db/${enc(db)}/new?prefix=${enc(newPrefix)}`);
            }}
          >
            <input
              placeholder="new id prefix, e.g. users/"
              value={newPrefix}
              onInput={(e) => setNewPrefix((e.target as HTMLInputElement).value)}
              data-testid="new-doc-prefix"
            />
            <button type="submit" data-testid="new-doc">
              New document
            </button>
          </form>
        </div>
        <p class="muted">
          {mode.kind === 'collection'
            ? `collection ${mode.name}, oldest write first`
            : mode.prefix
              ? `ids starting with “${mode.prefix}”, in id order`
              : 'every document, in id order'}
        </p>
        <ErrorBox error={error} />
        {docs === null ? (
          <p class="muted">loading…</p>
        ) : docs.length === 0 ? (
          <p class="muted">No documents.</p>
        ) : (
          <table data-testid="documents">
            <thead>
              <tr>
                <th>id</th>
                <th>etag</th>
                <th>content</th>
              </tr>
            </thead>
            <tbody>
              {docs.map((d) => {
                const id = d?.['@metadata']?.['@id'] ?? '';
                return (
                  <tr key={id} data-id={id}>
                    <td>
                      <a href={href('db', db, 'doc', id)}>{id}</a>
                    </td>
                    <td class="mono muted">{d?.['@metadata']?.['@etag']}</td>
                    <td class="mono">{preview(d)}</td>
                  </tr>
                );
              })}
            </tbody>
          </table>
        )}
        <Pager
          page={page}
          hasNext={!!next}
          onPrev={() => setCursors(cursors.slice(0, -1))}
          onNext={() => next && setCursors([...cursors, next])}
        />
      </div>
    </section>
  );
}
