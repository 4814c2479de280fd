import { useState } from 'preact/hooks';
import { api, enc, errorText } from '../api';
import { ErrorBox, Pager } from '../components';
import { href } from '../router';
import { HighlightsCell, ScoreCell, searchMeta } from '../search';

interface QueryAnswer {
  results: any[];
  total: number;
  skipped: number;
  stale: boolean;
  index: string | null;
  auto_index_created: string | null;
  continuation: string | null;
  duration_ms: number;
}

function cell(v: unknown): string {
  if (v === undefined) return '';
  if (typeof v === 'string') return v;
  return JSON.stringify(v);
}

function ResultTable({ db, rows }: { db: string; rows: any[] }) {
  const cols: string[] = [];
  for (const r of rows) {
    for (const k of Object.keys(r ?? {})) if (k !== '@metadata' && !cols.includes(k)) cols.push(k);
  }
  const scored = rows.some((r) => searchMeta(r).score !== undefined);
  const highlighted = rows.some((r) => searchMeta(r).highlights !== undefined);
  return (
    <table data-testid="results">
      <thead>
        <tr>
          <th>@id</th>
          {scored && <th>@score</th>}
          {highlighted && <th>@highlights</th>}
          {cols.map((c) => (
            <th key={c}>{c}</th>
          ))}
        </tr>
      </thead>
      <tbody>
        {rows.map((r, i) => {
          const id = r?.['@metadata']?.['@id'];
          return (
            <tr key={id ?? i}>
              <td>{id ? <a href={href('db', db, 'doc', id)}>{id}</a> : ''}</td>
              {scored && <ScoreCell r={r} />}
              {highlighted && <HighlightsCell r={r} />}
              {cols.map((c) => (
                <td key={c} class="mono">
                  {cell(r?.[c])}
                </td>
              ))}
            </tr>
          );
        })}
      </tbody>
    </table>
  );
}

const SAVED_QUERY = 'kiln.studio.query';

export function QueryPage({ db }: { db: string }) {
  const [query, setQuery] = useState(() => sessionStorage.getItem(SAVED_QUERY) ?? 'from users limit 20');
  const [params, setParams] = useState('{}');
  const [waitMs, setWaitMs] = useState(0);
  const [view, setView] = useState<'table' | 'json'>('table');
  const [answer, setAnswer] = useState<QueryAnswer | null>(null);
  // continuations[i] is the continuation that gives page i (null for the first).
  const [continuations, setContinuations] = useState<(string | null)[]>([null]);
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);

  const run = async (stack: (string | null)[]) => {
    let p: unknown;
    try {
      p = JSON.parse(params || '{}');
    } catch (e) {
      // The results on screen belong to the last query that ran: not to this one.
      setAnswer(null);
      setError(`parameters: ${errorText(e)}`);
      return;
    }
    setBusy(true);
    setError(null);
    sessionStorage.setItem(SAVED_QUERY, query);
    try {
      const body: Record<string, unknown> = { query, params: p, wait_for_non_stale_ms: waitMs };
      const c = stack[stack.length - 1];
      if (c) body.continuation = c;
      const r = await api<QueryAnswer>('POST', `/dbs/${enc(db)}/queries`, body);
      setAnswer(r.body);
      setContinuations(stack);
    } catch (e) {
      // A failed query shows its error alone, not above the previous query's
      // results (which would read as this query's).
      setAnswer(null);
      setError(errorText(e));
    } finally {
      setBusy(false);
    }
  };

  return (
    <section>
      <h1>Query {db}</h1>
      <form
        onSubmit={(e) => {
          e.preventDefault();
          run([null]);
        }}
      >
        <textarea
          class="editor small"
          spellcheck={false}
          value={query}
          onInput={(e) => setQuery((e.target as HTMLTextAreaElement).value)}
          onKeyDown={(e) => {
            if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) {
              e.preventDefault();
              run([null]);
            }
          }}
          data-testid="query"
        />
        <div class="row">
          <label>
            parameters (JSON){' '}
            <input class="mono" value={params} onInput={(e) => setParams((e.target as HTMLInputElement).value)} data-testid="params" />
          </label>
          <label>
            wait for non-stale (ms){' '}
            <input type="number" min={0} max={30000} value={waitMs} onInput={(e) => setWaitMs(Number((e.target as HTMLInputElement).value))} data-testid="wait-ms" />
          </label>
          <button type="submit" disabled={busy} data-testid="run-query">
            Run (Ctrl+Enter)
          </button>
        </div>
      </form>
      <p class="muted">
        <code>from users where age &gt;= $min and name startsWith 'A' order by age desc limit 20</code> — see docs/query-language.md
        for the language.
      </p>
      <ErrorBox error={error} />
      {answer && (
        <div>
          <div class="summary" data-testid="query-summary">
            <span>
              total <b data-testid="total">{answer.total}</b>
            </span>
            <span>
              stale <b data-testid="stale">{String(answer.stale)}</b>
            </span>
            <span>
              duration <b data-testid="duration">{answer.duration_ms} ms</b>
            </span>
            <span>
              index <b>{answer.index ?? 'none (scan)'}</b>
            </span>
            {answer.auto_index_created && (
              <span>
                created <b>{answer.auto_index_created}</b>
              </span>
            )}
            <span>
              showing <b data-testid="shown">{answer.results.length}</b> from {answer.skipped + 1}
            </span>
            <span class="toggle">
              <button type="button" class={view === 'table' ? 'active' : ''} onClick={() => setView('table')} data-testid="view-table">
                Table
              </button>
              <button type="button" class={view === 'json' ? 'active' : ''} onClick={() => setView('json')} data-testid="view-json">
                JSON
              </button>
            </span>
          </div>
          {view === 'table' ? (
            <ResultTable db={db} rows={answer.results} />
          ) : (
            <pre class="code" data-testid="results-json">
              {JSON.stringify(answer.results, null, 2)}
            </pre>
          )}
          <Pager
            page={continuations.length - 1}
            hasNext={!!answer.continuation}
            onPrev={() => run(continuations.slice(0, -1))}
            onNext={() => answer.continuation && run([...continuations, answer.continuation])}
          />
        </div>
      )}
    </section>
  );
}
