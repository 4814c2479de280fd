// Writes src/codes.ts from the server's error-code list, clients/error-codes.json
// (itself generated from kiln_server::error::ErrorCode::ALL). Run after the server
// gains a code: `npm run gen-codes`, then give the new code a class in src/errors.ts
// (test/errors.test.mjs fails until both are done).
import { readFileSync, writeFileSync } from "node:fs";

const src = new URL("../../error-codes.json", import.meta.url);
const out = new URL("../src/codes.ts", import.meta.url);
const rows = JSON.parse(readFileSync(src, "utf8")).codes;
let text = `// Every error code the server sends, with the HTTP status it is sent with.
// Generated from clients/error-codes.json by scripts/gen-codes.mjs: do not edit.

export const SERVER_ERROR_CODES: Readonly<Record<string, number>> = Object.freeze({
`;
for (const r of rows) text += `  ${r.code}: ${r.status},\n`;
text += "});\n";
writeFileSync(out, text);
console.log(`src/codes.ts: ${rows.length} codes`);
