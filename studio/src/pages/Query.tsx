import { useState } from 'preact/hooks';
import type { QueryResult } from 'kiln-client';
import { call, errorText, store } from '../api';
import { ErrorBox, Pager } from '../components';
import { href } from '../router';
import { HighlightsCell, ScoreCell } from '../search';

function cell(v: unknown): string {
  if (v === undefined) return '';
  if (typeof v === 'string') return v;
  return JSON.stringify(v);
}

/** The results, with a search's scores and highlights (the client takes them out of
 * each result's `@metadata` into `scores` and `highlights`). */
function ResultTable({ db, answer }: { db: string; answer: QueryResult<any> }) {
  const rows = answer.results;
  const cols: string[] = [];
  for (const r of rows) {
    for (const k of Object.keys(r ?? {})) if (k !== '@metadata' && !cols.includes(k)) cols.push(k);
  }
  const scored = answer.scores.some((s) => s !== undefined);
  const highlighted = answer.highlights.some((h) => Object.keys(h).length > 0);
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
              {scored && <ScoreCell score={answer.scores[i]} />}
              {highlighted && <HighlightsCell highlights={answer.highlights[i]} />}
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
  const [answer, setAnswer] = useState<QueryResult<any> | null>(null);
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
      if (p === null || typeof p !== 'object' || Array.isArray(p)) throw new Error('parameters must be a JSON object');
      const c = stack[stack.length - 1];
      const q = store(db).rawQuery(query, p as Record<string, unknown>).waitForNonStale(waitMs);
      setAnswer(await call(q.execute(c ? { continuation: c } : {})));
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
              duration <b data-testid="duration">{answer.durationMs} ms</b>
              {answer.fromCache && (
                <span class="muted" data-testid="from-cache">
                  {' '}
                  (304 Not Modified: the cached answer)
                </span>
              )}
            </span>
            <span>
              index <b>{answer.index ?? 'none (scan)'}</b>
            </span>
            {typeof answer.raw.auto_index_created === 'string' && !answer.fromCache && (
              <span>
                created <b>{answer.raw.auto_index_created}</b>
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
            <ResultTable db={db} answer={answer} />
          ) : (
            <pre class="code" data-testid="results-json">
              {JSON.stringify(answer.raw.results, null, 2)}
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
