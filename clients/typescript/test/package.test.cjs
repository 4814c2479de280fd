// The package as published: the CommonJS build loads with require() and has the same
// exports as the ES module build; .d.ts files are there; the library's code has no
// Node-only import (it runs in browsers: fetch, WebSocket, ReadableStream only).
const { test } = require("node:test");
const assert = require("node:assert/strict");
const { readFileSync, readdirSync, existsSync } = require("node:fs");
const { join } = require("node:path");

const pkgDir = join(__dirname, "..");

test("require('kiln-client') through the package's exports map (CommonJS build)", async () => {
  const cjs = require(pkgDir);
  assert.equal(typeof cjs.DocumentStore, "function");
  assert.equal(typeof cjs.ConcurrencyError, "function");
  const esm = await import(join(pkgDir, "dist/esm/index.js"));
  assert.deepEqual(Object.keys(cjs).filter((k) => k !== "__esModule").sort(), Object.keys(esm).sort());
  const e = cjs.errorFromResponse(409, '{"error":"conflict","message":"m","current_etag":"3-ab"}');
  assert.ok(e instanceof cjs.ConcurrencyError && e instanceof cjs.KilnError && e instanceof Error);
  assert.equal(e.currentEtag, "3-ab");
  assert.equal(e.name, "ConcurrencyError");
});

test("type declarations for both builds", () => {
  for (const d of ["esm", "cjs"]) {
    assert.ok(existsSync(join(pkgDir, "dist", d, "index.d.ts")), d);
    assert.ok(existsSync(join(pkgDir, "dist", d, "store.d.ts")), d);
  }
  const pkg = JSON.parse(readFileSync(join(pkgDir, "package.json"), "utf8"));
  assert.deepEqual(Object.keys(pkg.dependencies ?? {}), [], "zero runtime dependencies");
});

test("no Node-only import in the library (the browser path is the same code)", () => {
  const src = join(pkgDir, "src");
  for (const f of readdirSync(src)) {
    // Without comments (an example in a doc comment imports the package by name).
    const text = readFileSync(join(src, f), "utf8").replace(/\/\*[\s\S]*?\*\//g, "").replace(/^\s*\/\/.*$/gm, "");
    const imports = [
      ...[...text.matchAll(/^\s*(?:import|export)\s[^;]*?from\s*["']([^"']+)["']/gm)].map((m) => m[1]),
      ...[...text.matchAll(/\bimport\(\s*["']([^"']+)["']/g)].map((m) => m[1]),
    ];
    assert.ok(imports.length > 0 || f === "codes.ts" || f === "cache.ts", `${f}: no import found (the check would be blind)`);
    for (const spec of imports) assert.ok(spec.startsWith("./"), `${f} imports ${spec}`);
    assert.ok(!/\brequire\(|\bprocess\.|\bBuffer\b|__dirname/.test(text), `${f} uses a Node global`);
  }
  // And the compiler checks it: the library compiles against the DOM types only.
  const base = JSON.parse(readFileSync(join(pkgDir, "tsconfig.base.json"), "utf8"));
  assert.deepEqual(base.compilerOptions.types, []);
  assert.ok(base.compilerOptions.lib.includes("DOM"));
});

test("a strict TypeScript consumer type-checks against the published declarations", () => {
  const { spawnSync } = require("node:child_process");
  const tsc = join(pkgDir, "node_modules", "typescript", "bin", "tsc");
  const r = spawnSync(process.execPath, [tsc, "-p", join(pkgDir, "test", "types", "tsconfig.json")], { encoding: "utf8" });
  assert.equal(r.status, 0, r.stdout + r.stderr);
});
