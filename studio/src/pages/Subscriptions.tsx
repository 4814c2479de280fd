// A database's data subscriptions: each one's query, position (the etag acknowledged
// up to), last acknowledgment and whether a worker holds it, every 2 s; create one
// (name, query, start) and delete one: both need an admin key.
import { useState } from 'preact/hooks';
import { call, errorText, store, useAccess } from '../api';
import { Confirm, ErrorBox, usePoll } from '../components';
import { href } from '../router';

interface Sub {
  name: string;
  query: string;
  collection: string;
  created_at: string;
  position: string | null;
  acknowledged_at: string | null;
  acknowledgments: number;
  connected: boolean;
}

const when = (t: string | null) => (t ? new Date(t).toLocaleString('en') : '–');

export function SubscriptionsPage({ db }: { db: string }) {
  const [subs, setSubs] = useState<Sub[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [name, setName] = useState('');
  const [query, setQuery] = useState('');
  const [start, setStart] = useState('beginning');
  const [deleting, setDeleting] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const admin = useAccess(db) === 'admin';

  const load = async () => {
    try {
      const list = (await call(store(db).subscriptions())) as unknown as Sub[];
      setSubs([...list].sort((a, b) => a.name.localeCompare(b.name)));
    } catch (e) {
      setError(errorText(e));
    }
  };
  usePoll(load, 2000, [db]);

  const create = async (e: Event) => {
    e.preventDefault();
    setBusy(true);
    setError(null);
    try {
      await call(store(db).createSubscription(name.trim(), query.trim(), { start }));
      setName('');
      setQuery('');
      await load();
    } catch (err) {
      setError(errorText(err));
    } finally {
      setBusy(false);
    }
  };

  const remove = async (n: string) => {
    setDeleting(null);
    setError(null);
    try {
      await call(store(db).deleteSubscription(n));
      await load();
    } catch (err) {
      setError(errorText(err));
    }
  };

  return (
    <section>
      <p>
        <a href={href('db', db)}>← {db}</a>
      </p>
      <h1>Data subscriptions of {db}</h1>
      <p class="muted">
        A subscription is a durable cursor over a collection, read by one worker at a time (kiln-client's{' '}
        <code>store.subscription(name).run(handler)</code>); its position moves when the worker acknowledges a batch.
      </p>
      {admin && (
        <form class="row" onSubmit={create} data-testid="new-subscription">
          <input
            placeholder="name, e.g. big-orders"
            value={name}
            onInput={(e) => setName((e.target as HTMLInputElement).value)}
            data-testid="subscription-name"
          />
          <input
            class="grow"
            placeholder="from orders where total > 100"
            value={query}
            onInput={(e) => setQuery((e.target as HTMLInputElement).value)}
            data-testid="subscription-query"
          />
          <label>
            start{' '}
            <select value={start} onChange={(e) => setStart((e.target as HTMLSelectElement).value)} data-testid="subscription-start">
              <option value="beginning">from the beginning</option>
              <option value="now">from now</option>
            </select>
          </label>
          <button type="submit" disabled={!name.trim() || !query.trim() || busy} data-testid="create-subscription">
            Create subscription
          </button>
        </form>
      )}
      <ErrorBox error={error} />
      {subs === null ? (
        <p class="muted">loading…</p>
      ) : subs.length === 0 ? (
        <p class="muted" data-testid="no-subscriptions">
          No data subscriptions.
        </p>
      ) : (
        <table data-testid="subscriptions">
          <thead>
            <tr>
              <th>name</th>
              <th>query</th>
              <th>position</th>
              <th>last acknowledged</th>
              <th class="num">acks</th>
              <th>worker</th>
              <th>created</th>
              <th />
            </tr>
          </thead>
          <tbody>
            {subs.map((s) => (
              <tr key={s.name} data-subscription={s.name}>
                <td>{s.name}</td>
                <td class="mono" data-testid="subscription-query-text">
                  {s.query}
                </td>
                <td class="mono" data-testid="subscription-position">
                  {s.position ?? 'beginning'}
                </td>
                <td>{when(s.acknowledged_at)}</td>
                <td class="num">{s.acknowledgments}</td>
                <td>{s.connected ? 'connected' : '–'}</td>
                <td class="muted">{when(s.created_at)}</td>
                <td class="actions">
                  {admin && (
                    <button type="button" class="danger small" onClick={() => setDeleting(s.name)} data-testid="delete-subscription">
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
        <Confirm title={`Delete subscription ${deleting}?`} confirmLabel="Delete subscription" onConfirm={() => remove(deleting)} onCancel={() => setDeleting(null)}>
          Its position is lost; a connected worker is closed (4004).
        </Confirm>
      )}
    </section>
  );
}
