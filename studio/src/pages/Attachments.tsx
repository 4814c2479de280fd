// A document's attachments: listed from its @metadata, downloaded through the client
// (the bytes fetched with the key in the Authorization header, then saved from a blob:
// URL: a plain link would go without the key), uploaded from a file input (the File,
// a Blob, streamed by the client's putAttachment) and deleted, both with If-Match.
import { useState } from 'preact/hooks';
import { ConcurrencyError, type AttachmentInfo } from 'kiln-client';
import { call, errorText, formatBytes, store } from '../api';
import { Confirm, ErrorBox } from '../components';

export function Attachments(props: {
  db: string;
  id: string;
  /** The document's etag (the If-Match of an upload or delete). */
  etag: string | null;
  list: AttachmentInfo[];
  mayWrite: boolean;
  /** Called after an upload or a delete (the document has a new etag). */
  onChanged: () => Promise<void>;
}) {
  const { db, id, etag, list } = props;
  const [file, setFile] = useState<File | null>(null);
  const [name, setName] = useState('');
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const [status, setStatus] = useState<string | null>(null);
  const [deleting, setDeleting] = useState<string | null>(null);

  const failed = (e: unknown) =>
    setError(
      e instanceof ConcurrencyError
        ? 'The document changed on the server since you opened it (409): reload it and try again.'
        : errorText(e),
    );

  const download = async (a: AttachmentInfo) => {
    setError(null);
    try {
      const bytes = await call(store(db).attachmentBytes(id, a.name));
      const url = URL.createObjectURL(new Blob([bytes as BlobPart], { type: a.content_type || 'application/octet-stream' }));
      const link = document.createElement('a');
      link.href = url;
      link.download = a.name;
      document.body.appendChild(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60_000);
      setStatus(`downloaded ${a.name} (${formatBytes(bytes.length)})`);
    } catch (e) {
      failed(e);
    }
  };

  const upload = async (e: Event) => {
    e.preventDefault();
    if (!file) return;
    setBusy(true);
    setError(null);
    setStatus(null);
    const as = name.trim() || file.name;
    try {
      await call(
        store(db).putAttachment(id, as, file, {
          contentType: file.type || 'application/octet-stream',
          ...(etag ? { ifMatch: etag } : {}),
        }),
      );
      setFile(null);
      setName('');
      (e.target as HTMLFormElement).reset();
      await props.onChanged();
      setStatus(`uploaded ${as}`);
    } catch (err) {
      failed(err);
    } finally {
      setBusy(false);
    }
  };

  const remove = async (n: string) => {
    setDeleting(null);
    setError(null);
    setStatus(null);
    try {
      await call(store(db).deleteAttachment(id, n, etag ? { ifMatch: etag } : {}));
      await props.onChanged();
      setStatus(`deleted ${n}`);
    } catch (e) {
      failed(e);
    }
  };

  return (
    <div class="panel" data-testid="attachments">
      <h3>Attachments</h3>
      {list.length === 0 ? (
        <p class="muted" data-testid="no-attachments">
          No attachments.
        </p>
      ) : (
        <table>
          <thead>
            <tr>
              <th>name</th>
              <th>content type</th>
              <th class="num">size</th>
              <th>SHA-256</th>
              <th />
            </tr>
          </thead>
          <tbody>
            {list.map((a) => (
              <tr key={a.name} data-attachment={a.name}>
                <td>{a.name}</td>
                <td class="mono">{a.content_type}</td>
                <td class="num" title={`${a.size} bytes`} data-testid="attachment-size">
                  {formatBytes(a.size)}
                </td>
                <td class="mono muted" title={a.hash}>
                  {a.hash.slice(0, 16)}…
                </td>
                <td class="actions">
                  <button type="button" class="small" onClick={() => download(a)} data-testid="download-attachment">
                    Download
                  </button>
                  {props.mayWrite && (
                    <button type="button" class="danger small" onClick={() => setDeleting(a.name)} data-testid="delete-attachment">
                      Delete
                    </button>
                  )}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      {props.mayWrite && (
        <form class="row" onSubmit={upload}>
          <input
            type="file"
            onChange={(e) => {
              const f = (e.target as HTMLInputElement).files?.[0] ?? null;
              setFile(f);
              if (f && !name) setName(f.name);
            }}
            data-testid="attachment-file"
          />
          <input
            placeholder="name (default: the file's)"
            value={name}
            onInput={(e) => setName((e.target as HTMLInputElement).value)}
            data-testid="attachment-name"
          />
          <button type="submit" disabled={!file || busy} data-testid="upload-attachment">
            Upload
          </button>
        </form>
      )}
      {status && (
        <p class="ok" data-testid="attachment-status">
          {status}
        </p>
      )}
      <ErrorBox error={error} />
      {deleting && (
        <Confirm title={`Delete attachment ${deleting}?`} confirmLabel="Delete attachment" onConfirm={() => remove(deleting)} onCancel={() => setDeleting(null)}>
          The attachment is removed from {id} (the document gets a new etag).
        </Confirm>
      )}
    </div>
  );
}
