// Every ```js example of README.md (those not marked no-run), run in order as one
// module against a fresh server: the documentation cannot rot silently.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readFileSync, writeFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { PKG, startServer, dbName } from "./helpers.mjs";

let server;
before(async () => { server = await startServer(); });
after(async () => { await server?.stop(); });

export function readmeBlocks(text) {
  const blocks = [];
  const re = /^```(\S*)([^\n]*)\n([\s\S]*?)^```/gm;
  let m;
  while ((m = re.exec(text)) !== null) {
    if (m[1] === "js" && !m[2].includes("no-run")) blocks.push(m[3]);
  }
  return blocks;
}

test("the README's examples run against a real server", () => {
  const blocks = readmeBlocks(readFileSync(join(PKG, "README.md"), "utf8"));
  assert.ok(blocks.length >= 7, `found ${blocks.length} runnable blocks`);
  const db = dbName();
  const code = blocks.join("\n;\n")
    .replaceAll('from "kiln-client"', `from ${JSON.stringify(join(PKG, "dist/esm/index.js"))}`)
    .replaceAll("http://127.0.0.1:8080", server.url)
    .replaceAll('"shop"', JSON.stringify(db))
    + `\n;await store.deleteDatabase(); await store.close();\n`;
  const file = join(PKG, "test", `.readme-${db}.mjs`);
  writeFileSync(file, code);
  try {
    const r = spawnSync(process.execPath, ["--experimental-websocket", file], { encoding: "utf8", timeout: 60_000 });
    assert.equal(r.status, 0, `the examples failed:\n${r.stdout}\n${r.stderr}`);
    assert.ok(!r.stderr.includes("Assertion failed"), r.stderr);
    const out = r.stdout;
    assert.match(out, /^users\/\d+$/m, "the generated id");
    assert.match(out, /^users\/ada \d+-\w+ \d+-\w+$/m, "the conflict's id and both etags");
    assert.match(out, /aggressiveHits: 99\d/, "aggressive caching answered from the cache");
    assert.match(out, /^10000 \d+-\w+$/m, "bulk insert acked everything");
    assert.match(out, /^put users\/cy /m, "the changes callback");
    assert.match(out, /^iterated users\/cy$/m, "the changes iterator");
    assert.match(out, /from users where age > \$p0 order by name/);
    assert.match(out, /^10$/m, "ten groups");
    assert.match(out, /^206 hello$/m);
    assert.match(out, /^ship orders\/1$/m);
    assert.match(out, /^true true$/m, "the database in GET /stats");
    assert.match(out, /^users-by-age$/m, "an index defined and read back");
    assert.match(out, /^not clustered$/m, "GET /cluster of a single server");
  } finally {
    rmSync(file, { force: true });
  }
});
