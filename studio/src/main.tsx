import { render } from 'preact';
import { useEffect, useState } from 'preact/hooks';
import { AuthenticationError } from 'kiln-client';
import { apiKey, errorText, onAuthRequired, server, setApiKey } from './api';
import { href, onLinkClick, useRoute } from './router';
import { Databases } from './pages/Databases';
import { DatabasePage } from './pages/Database';
import { DocumentPage } from './pages/Document';
import { QueryPage } from './pages/Query';
import { IndexesPage } from './pages/Indexes';
import { LivePage } from './pages/Live';
import { SubscriptionsPage } from './pages/Subscriptions';
import './style.css';

function Login({ onDone }: { onDone: () => void }) {
  const [key, setKey] = useState('');
  const [error, setError] = useState<string | null>(null);
  const submit = async (e: Event) => {
    e.preventDefault();
    setApiKey(key);
    try {
      await server().databaseNames();
      onDone();
    } catch (err) {
      setApiKey(null);
      setError(err instanceof AuthenticationError ? 'That key is not valid.' : errorText(err));
    }
  };
  return (
    <form class="login card" onSubmit={submit} data-testid="login">
      <h2>This server requires an API key</h2>
      <p>
        Create one with <code>kiln api-key create --data-dir DIR --name studio --operator</code>. It is kept in
        this tab's session storage only and sent in the <code>Authorization</code> header.
      </p>
      <input
        type="password"
        autocomplete="off"
        placeholder="kiln_…"
        value={key}
        onInput={(e) => setKey((e.target as HTMLInputElement).value)}
        data-testid="api-key"
      />
      <button type="submit" data-testid="login-submit">
        Sign in
      </button>
      {error && <div class="error">{error}</div>}
    </form>
  );
}

function Page({ route }: { route: string[] }) {
  const [first, db, section, ...rest] = route;
  if (first === 'live') return <LivePage />;
  if (first === 'db' && db) {
    if (section === 'doc') return <DocumentPage db={db} id={rest.join('/')} />;
    if (section === 'new') return <DocumentPage db={db} id={null} />;
    if (section === 'query') return <QueryPage db={db} />;
    if (section === 'indexes') return <IndexesPage db={db} />;
    if (section === 'subscriptions') return <SubscriptionsPage db={db} />;
    return <DatabasePage db={db} />;
  }
  return <Databases />;
}

function App() {
  const route = useRoute();
  const [needKey, setNeedKey] = useState(false);
  // Bumped at each sign-in, so the page under the login form loads again.
  const [signIns, setSignIns] = useState(0);
  useEffect(() => onAuthRequired(() => setNeedKey(true)), []);
  const db = route[0] === 'db' ? route[1] : undefined;
  return (
    <div onClick={onLinkClick as any}>
      <header>
        <a class="brand" href={href()}>
          Kiln studio
        </a>
        <nav>
          <a href={href()}>Databases</a>
          {db && <a href={href('db', db)}>{db}</a>}
          {db && <a href={href('db', db, 'query')}>Query</a>}
          {db && <a href={href('db', db, 'indexes')}>Indexes</a>}
          {db && <a href={href('db', db, 'subscriptions')}>Subscriptions</a>}
          <a href={href('live')}>Live</a>
        </nav>
        {apiKey() && (
          <button
            type="button"
            class="link"
            onClick={() => {
              setApiKey(null);
              setNeedKey(true);
            }}
          >
            Sign out
          </button>
        )}
      </header>
      <main>
        {needKey ? (
          <Login
            onDone={() => {
              setNeedKey(false);
              setSignIns((n) => n + 1);
            }}
          />
        ) : (
          <Page key={`${route.join('/')}#${signIns}`} route={route} />
        )}
      </main>
    </div>
  );
}

const root = document.getElementById('app');
if (root) render(<App />, root);
