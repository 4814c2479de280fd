// Client-side routes under /studio/ (the server answers index.html for any of them).
import { useEffect, useState } from 'preact/hooks';

export const BASE = '/studio/';

export const enc = encodeURIComponent;

export function navigate(path: string): void {
  history.pushState(null, '', BASE + path.replace(/^\//, ''));
  dispatchEvent(new PopStateEvent('popstate'));
}

/** The path after /studio/, decoded segment by segment. */
export function useRoute(): string[] {
  const read = () =>
    location.pathname
      .slice(BASE.length - 1)
      .split('/')
      .filter((s) => s !== '')
      .map(decodeURIComponent);
  const [parts, setParts] = useState(read);
  useEffect(() => {
    const f = () => setParts(read());
    addEventListener('popstate', f);
    return () => removeEventListener('popstate', f);
  }, []);
  return parts;
}

/** Same-origin links that route in the page. */
export function onLinkClick(e: MouseEvent): void {
  const a = (e.target as HTMLElement).closest('a');
  if (!a || e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey) return;
  const href = a.getAttribute('href');
  if (!href || !href.startsWith(BASE)) return;
  e.preventDefault();
  navigate(href.slice(BASE.length));
}

export function href(...parts: string[]): string {
  return BASE + parts.map(encodeURIComponent).join('/');
}
