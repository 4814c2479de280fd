import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vite';

// The studio is served by `kiln serve` under /studio/ from the binary itself: every
// asset URL is absolute under that base, hashed, and nothing is inlined into
// index.html (the server's Content-Security-Policy allows no inline script or style).
// `npm run dev` serves the sources and sends the API to a running `kiln serve`
// (KILN_URL, default http://127.0.0.1:8080).
//
// Every request goes through kiln-client, the repository's TypeScript client, bundled
// from its sources (clients/typescript/src; tsconfig.json's `paths` says the same to
// tsc): `npm ci` here is all a build needs (no build of the client first, no copy of
// it in node_modules), and Rollup keeps only what the studio reaches.
const client = fileURLToPath(new URL('../clients/typescript/src', import.meta.url));
const kiln = process.env.KILN_URL ?? 'http://127.0.0.1:8080';
const proxy = Object.fromEntries(
  ['/dbs', '/stats', '/health', '/metrics', '/cluster'].map((p) => [p, { target: kiln, ws: true, changeOrigin: true }]),
);

export default defineConfig({
  base: '/studio/',
  resolve: { alias: { 'kiln-client': `${client}/index.ts` } },
  server: { proxy, fs: { allow: ['.', client] } },
  esbuild: { jsx: 'automatic', jsxImportSource: 'preact' },
  build: {
    outDir: 'dist',
    emptyOutDir: true,
    target: 'es2022',
    modulePreload: { polyfill: false },
    assetsInlineLimit: 0,
    sourcemap: false,
    reportCompressedSize: false,
  },
});
