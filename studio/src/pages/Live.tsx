import { useEffect, useRef, useState } from 'preact/hooks';
import { ForbiddenError, NotClusteredError, type Change, type ClusterStatus, type DatabaseFigures as DbStats, type ServerStats as Stats } from 'kiln-client';
import { call, errorText, server, store } from '../api';
import { Chart, COLORS, Series } from '../chart';
import { ErrorBox, usePoll } from '../components';

const CAPACITY = 120; // two minutes at one sample a second
const STATUS_CLASSES = ['2xx', '3xx', '4xx', '5xx'];

type History = Record<string, number[]>;

function sum(dbs: DbStats[], f: (d: DbStats) => number): number {
  return dbs.reduce((a, d) => a + f(d), 0);
}

function push(h: History, key: string, v: number) {
  const a = (h[key] ??= []);
  a.push(Number.isFinite(v) ? v : 0);
  if (a.length > CAPACITY) a.shift();
}

/** The Live figures: every second, `GET /stats`, differences over the elapsed time. */
function useLiveFigures(db: string) {
  const prev = useRef<{ at: number; s: Stats } | null>(null);
  const hist = useRef<History>({});
  const [, setVersion] = useState(0);
  const [error, setError] = useState<string | null>(null);
  const [names, setNames] = useState<string[]>([]);

  useEffect(() => {
    prev.current = null;
    hist.current = {};
  }, [db]);

  usePoll(
    async () => {
      let s: Stats;
      try {
        s = await call(server().serverStats());
        setError(null);
      } catch (e) {
        setError(
          e instanceof ForbiddenError
            ? 'The live figures are the whole server’s: they need an operator key (kiln api-key create --operator).'
            : errorText(e),
        );
        return;
      }
      const at = performance.now();
      setNames(s.databases.map((d) => d.name).sort());
      const p = prev.current;
      prev.current = { at, s };
      if (!p) return;
      const dt = (at - p.at) / 1000;
      const pick = (x: Stats) => (db ? x.databases.filter((d) => d.name === db) : x.databases);
      const now = pick(s);
      const before = pick(p.s);
      const rate = (f: (d: DbStats) => number) => Math.max(0, (sum(now, f) - sum(before, f)) / dt);
      const h = hist.current;
      push(h, 'commits', rate((d) => d.commits));
      const writes = sum(now, (d) => d.journal_writes) - sum(before, (d) => d.journal_writes);
      const units = sum(now, (d) => d.commit_units) - sum(before, (d) => d.commit_units);
      push(h, 'units_per_write', writes > 0 ? units / writes : 0);
      const active = now.filter((d) => d.journal_writes > 0);
      push(h, 'p50', Math.max(0, ...active.map((d) => d.journal_write_p50_us)));
      push(h, 'p99', Math.max(0, ...active.map((d) => d.journal_write_p99_us)));
      push(h, 'syncs', rate((d) => d.data_syncs));
      push(h, 'written_back', rate((d) => d.pages_written_back));
      push(h, 'unflushed', sum(now, (d) => d.pages_unflushed));
      push(h, 'docs', rate((d) => d.documents_written));
      for (const c of STATUS_CLASSES) {
        const d = (s.http_requests_by_status[c] ?? 0) - (p.s.http_requests_by_status[c] ?? 0);
        push(h, `http_${c}`, Math.max(0, d / dt));
      }
      push(h, 'connections', s.connections_open);
      push(h, 'ws', s.ws_connections_open);
      push(h, 'rss', (s.resident_memory_bytes ?? 0) / (1 << 20));
      setVersion((v) => v + 1);
    },
    1000,
    [db],
  );
  return { hist: hist.current, error, names };
}

/** The database's changes from now on, over the client's changes feed (one WebSocket,
 * which reconnects by itself and resumes after the last change shown). */
function ChangesTail({ db }: { db: string }) {
  const [lines, setLines] = useState<Change[]>([]);
  const [state, setState] = useState('connecting');
  useEffect(() => {
    setLines([]);
    if (!db) return;
    setState('connecting');
    const changes = store(db).changes({
      buffer: 0, // callbacks only: nothing kept for an iterator
      onConnected: () => setState('live'),
      onDisconnected: () => setState(`closed (${changes.lastClose}); reconnecting`),
      onError: (e) => setState(`error: ${e.message}`),
    });
    changes.forAll().subscribe((c) => setLines((l) => [c, ...l].slice(0, 200)));
    return () => {
      void changes.close();
    };
  }, [db]);
  if (!db) return <p class="muted">Choose a database to follow its changes.</p>;
  return (
    <div>
      <p class="muted">
        changes of <b>{db}</b> over a WebSocket: <span data-testid="tail-state">{state}</span>
      </p>
      <table class="tail" data-testid="tail">
        <thead>
          <tr>
            <th>etag</th>
            <th>change</th>
            <th>id</th>
            <th>collection</th>
          </tr>
        </thead>
        <tbody>
          {lines.map((c) => (
            <tr key={c.etag}>
              <td class="mono">{c.etag}</td>
              <td>{c.change}</td>
              <td>{c.id}</td>
              <td>{c.collection}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

const ROLE_TAG: Record<string, string> = { leader: 'tag good', follower: 'tag', learner: 'tag warn' };

/** The cluster every second; a server started without --cluster answers 404
 * `not_clustered`, shown as one line (and no longer asked: that takes a restart). */
function ClusterPanel() {
  const [status, setStatus] = useState<ClusterStatus | null>(null);
  const [single, setSingle] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const stopped = useRef(false);
  usePoll(
    async () => {
      if (stopped.current) return;
      try {
        setStatus(await call(server().clusterStatus()));
        setError(null);
      } catch (e) {
        if (e instanceof NotClusteredError) {
          stopped.current = true;
          setSingle(true);
        } else setError(errorText(e));
      }
    },
    1000,
    [],
  );
  if (single) {
    return (
      <p class="muted" data-testid="cluster-single">
        single node (not clustered)
      </p>
    );
  }
  if (!status) return error ? <ErrorBox error={error} /> : <p class="muted">loading…</p>;
  const known = (n: number | null) => (n === null ? '–' : n.toLocaleString('en'));
  return (
    <div data-testid="cluster">
      <ErrorBox error={error} />
      <div class="summary">
        <span>
          this node <b data-testid="cluster-node">{status.node_id}</b> ({status.state})
        </span>
        <span>
          leader <b data-testid="cluster-leader">{status.leader ?? 'none (electing)'}</b>
        </span>
        <span>
          term <b data-testid="cluster-term">{status.term}</b>
        </span>
        <span>
          log index <b>{known(status.last_log_index)}</b>, applied <b>{known(status.last_applied)}</b>
        </span>
      </div>
      <table data-testid="cluster-members">
        <thead>
          <tr>
            <th>id</th>
            <th>address</th>
            <th>role</th>
            <th class="num">applied</th>
            <th class="num">lag (entries)</th>
          </tr>
        </thead>
        <tbody>
          {status.members.map((m) => (
            <tr key={m.id} data-member={m.id}>
              <td>
                {m.id} {m.id === status.node_id && <span class="muted">(this node)</span>}
              </td>
              <td class="mono">{m.address}</td>
              <td>
                <span class={ROLE_TAG[m.role] ?? 'tag'} data-testid="role">
                  {m.role}
                </span>
              </td>
              <td class="num" data-testid="applied">
                {known(m.applied)}
              </td>
              <td class="num" data-testid="lag">
                {known(m.lag)}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
      {status.leader !== status.node_id && (
        <p class="muted">A follower knows only its own progress: the leader's studio shows every member's.</p>
      )}
    </div>
  );
}

export function LivePage() {
  const [db, setDb] = useState(() => new URLSearchParams(location.search).get('db') ?? '');
  const { hist, error, names } = useLiveFigures(db);
  const s = (key: string, name: string, color: string): Series => ({ name, color, values: hist[key] ?? [] });
  const charts: { id: string; title: string; unit: string; series: Series[] }[] = [
    { id: 'commits', title: 'Commits/s', unit: '', series: [s('commits', 'commits', COLORS[0])] },
    { id: 'docs', title: 'Documents written/s', unit: '', series: [s('docs', 'docs', COLORS[0])] },
    { id: 'units', title: 'Units per journal write', unit: '', series: [s('units_per_write', 'units', COLORS[0])] },
    {
      id: 'latency',
      title: 'Journal write latency',
      unit: ' µs',
      series: [s('p50', 'p50', COLORS[0]), s('p99', 'p99', COLORS[1])],
    },
    { id: 'syncs', title: 'Data-file syncs/s', unit: '', series: [s('syncs', 'syncs', COLORS[0])] },
    {
      id: 'writeback',
      title: 'Write-back (pages)',
      unit: '',
      series: [s('written_back', 'written back/s', COLORS[0]), s('unflushed', 'unflushed', COLORS[3])],
    },
    {
      id: 'http',
      title: 'HTTP requests/s by status',
      unit: '',
      series: STATUS_CLASSES.map((c, i) => s(`http_${c}`, c, [COLORS[2], COLORS[4], COLORS[3], COLORS[1]][i])),
    },
    {
      id: 'connections',
      title: 'Open connections',
      unit: '',
      series: [s('connections', 'HTTP', COLORS[0]), s('ws', 'WebSocket', COLORS[2])],
    },
    { id: 'memory', title: 'Resident memory', unit: ' MiB', series: [s('rss', 'RSS', COLORS[4])] },
  ];
  return (
    <section>
      <h1>Live</h1>
      <div class="row">
        <label>
          database{' '}
          <select value={db} onChange={(e) => setDb((e.target as HTMLSelectElement).value)} data-testid="live-db">
            <option value="">all databases</option>
            {names.map((n) => (
              <option key={n} value={n}>
                {n}
              </option>
            ))}
          </select>
        </label>
        <span class="muted">one sample a second from GET /stats; the last two minutes</span>
      </div>
      <ErrorBox error={error} />
      <div class="charts">
        {charts.map((c) => (
          <Chart key={c.id} capacity={CAPACITY} {...c} />
        ))}
      </div>
      <h2>Cluster</h2>
      <ClusterPanel />
      <h2>Changes</h2>
      <ChangesTail db={db} />
    </section>
  );
}
