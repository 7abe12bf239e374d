// The hand-written declarations match the code: the same exports, the same
// client methods, and a usage file that type-checks (when TypeScript is installed).

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import * as fs from "node:fs";
import * as path from "node:path";
import { test } from "node:test";

import { PACKAGE_DIR } from "./helpers.js";
import * as client from "../src/index.js";

const declarations = fs.readFileSync(path.join(PACKAGE_DIR, "index.d.ts"), "utf8");

/** The members declared in the body of `export class NAME … { … }`. */
function declaredMembers(name) {
  const start = declarations.indexOf(`export class ${name} `);
  const body = declarations.slice(declarations.indexOf("{", start), declarations.indexOf("\n}", start));
  return [...body.matchAll(/^ {2}(?:static |readonly )?(\w+)[<(?]/gm)].map((match) => match[1]);
}

test("index.d.ts declares every value the package exports, and no other", () => {
  const declared = [...declarations.matchAll(/^export (?:class|function|const) (\w+)/gm)].map((match) => match[1]);
  assert.deepEqual(declared.sort(), Object.keys(client).sort());
});

test("every method of Snapshotd is declared", () => {
  const methods = Object.getOwnPropertyNames(client.Snapshotd.prototype)
    .filter((name) => name !== "constructor" && !name.startsWith("_"));
  const declared = new Set(declaredMembers("Snapshotd"));
  assert.deepEqual(methods.filter((name) => !declared.has(name)), []);
  for (const name of declared) {
    if (name !== "constructor" && name !== "socketPath") {
      assert.ok(name in client.Snapshotd.prototype || name in client.Snapshotd, `${name} is implemented`);
    }
  }
});

function findTsc() {
  const local = path.join(PACKAGE_DIR, "node_modules", ".bin", "tsc");
  if (fs.existsSync(local)) return local;
  const found = spawnSync("sh", ["-c", "command -v tsc"], { encoding: "utf8" });
  return found.status === 0 ? found.stdout.trim() : null;
}

const tsc = findTsc();

test("the declarations type-check a use of the whole API", { skip: !tsc && "TypeScript is not installed (npm install in clients/node)" }, () => {
  const run = spawnSync(tsc, ["-p", path.join(PACKAGE_DIR, "test", "types")], { encoding: "utf8" });
  assert.equal(run.status, 0, run.stdout + run.stderr);
});
