// dist/cjs holds CommonJS files under a "type": "module" package: a package.json of
// its own tells Node to read them as CommonJS.
import { writeFileSync } from "node:fs";
writeFileSync(new URL("../dist/cjs/package.json", import.meta.url), '{"type": "commonjs"}\n');
