// Full-text search results: a result's score (BM25) and highlights (path -> a snippet
// the server made as HTML: the document's text escaped, the matched words in
// <b>...</b>), which the server sends in `@metadata.@score` and `@metadata.@highlights`
// and kiln-client hands over as the answer's `scores` and `highlights`.
//
// The snippet is never given to the browser as HTML: it is split on the literal
// `<b>` and `</b>` tags, each piece's entities are decoded, and the pieces become
// text nodes (inside <b> elements for the matched words). Anything else in it,
// markup included, shows as text.

const ENTITIES: Record<string, string> = { amp: '&', lt: '<', gt: '>', quot: '"', apos: "'" };

/** The text of an escaped HTML fragment with no tags: `&lt;` -> `<`, `&#x27;` -> `'`. */
export function unescapeHtml(s: string): string {
  return s.replace(/&(#x[0-9a-fA-F]{1,6}|#[0-9]{1,7}|[a-zA-Z]{2,8});/g, (whole, e: string) => {
    if (e[0] === '#') {
      const code = e[1] === 'x' || e[1] === 'X' ? parseInt(e.slice(2), 16) : parseInt(e.slice(1), 10);
      return code > 0 && code <= 0x10ffff ? String.fromCodePoint(code) : whole;
    }
    return ENTITIES[e] ?? whole;
  });
}

/** The pieces of a snippet: `[text, matched]`, in order. */
export function snippetPieces(html: string): [string, boolean][] {
  const out: [string, boolean][] = [];
  let bold = false;
  for (const part of html.split(/(<b>|<\/b>)/)) {
    if (part === '<b>') bold = true;
    else if (part === '</b>') bold = false;
    else if (part) out.push([unescapeHtml(part), bold]);
  }
  return out;
}

export function Snippet({ html }: { html: string }) {
  return (
    <span class="snippet">
      {snippetPieces(html).map(([text, matched], i) => (matched ? <b key={i}>{text}</b> : text))}
    </span>
  );
}

export function ScoreCell({ score }: { score: number | undefined }) {
  return (
    <td class="num" data-testid="score">
      {score === undefined ? '' : score.toFixed(3)}
    </td>
  );
}

export function HighlightsCell({ highlights }: { highlights: Record<string, string> | undefined }) {
  return (
    <td class="highlights" data-testid="highlights">
      {Object.entries(highlights ?? {}).map(([path, html]) => (
        <div key={path}>
          <span class="muted">{path}: </span>
          {typeof html === 'string' ? <Snippet html={html} /> : ''}
        </div>
      ))}
    </td>
  );
}
