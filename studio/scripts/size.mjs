// Prints the studio's weight: every file in dist/, raw and gzipped (level 9, what the
// server's build.rs does), and fails the build beyond the 500 KB gzipped budget.
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { gzipSync } from 'node:zlib';

const BUDGET_GZIP_BYTES = 500 * 1000;
const dist = new URL('../dist/', import.meta.url).pathname;
const files = [];
const walk = (d) => {
  for (const n of readdirSync(d)) {
    const p = join(d, n);
    if (statSync(p).isDirectory()) walk(p);
    else files.push(p);
  }
};
walk(dist);
let raw = 0;
let gz = 0;
for (const f of files.sort()) {
  const b = readFileSync(f);
  const g = gzipSync(b, { level: 9 }).length;
  raw += b.length;
  gz += Math.min(g, b.length);
  console.log(`  ${relative(dist, f).padEnd(40)} ${String(b.length).padStart(8)} B  ${String(g).padStart(7)} B gzip`);
}
console.log(`studio weight: ${raw} B raw, ${gz} B gzipped (budget ${BUDGET_GZIP_BYTES} B)`);
if (gz > BUDGET_GZIP_BYTES) {
  console.error('the studio is over its weight budget');
  process.exit(1);
}
