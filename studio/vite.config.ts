import { defineConfig } from 'vite';

// The studio is served by `kiln serve` under /studio/ from the binary itself: every
// asset URL is absolute under that base, hashed, and nothing is inlined into
// index.html (the server's Content-Security-Policy allows no inline script or style).
export default defineConfig({
  base: '/studio/',
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
