// The SDK's wire types cannot drift from the server: src/generated/ must be exactly what
// the running services' /openapi.json generates. A field the server adds, renames, retypes
// or makes optional changes the generated text, so this fails until the types are
// regenerated (`python -m tests.typescript.regenerate`, or `npm run generate`); then
// CLIENT_METHODS and DISPATCHER_METHODS fail to compile until a new endpoint is covered.

import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { describe, test } from "node:test";
import { generate, type OpenApiDocument } from "../tools/codegen.js";
import { fetchDocument, generatedPath, SERVICES } from "../tools/generate.js";
import { env } from "./support.js";

function firstDifference(committed: string, served: string): string {
  const a = committed.split("\n");
  const b = served.split("\n");
  const line = a.findIndex((text, index) => text !== b[index]);
  const at = line === -1 ? a.length : line;
  return `line ${at + 1}: committed ${JSON.stringify(a[at])}, the server's ${JSON.stringify(b[at])}`;
}

async function served(service: (typeof SERVICES)[number]): Promise<OpenApiDocument> {
  return fetchDocument(service === "api" ? env.apiUrl : env.dispatcherUrl);
}

describe("generated types", () => {
  for (const service of SERVICES) {
    test(`src/generated/${service}.ts is what the running ${service} serves`, async () => {
      const committed = await readFile(generatedPath(service), "utf8");
      const fresh = generate(service, await served(service));
      assert.ok(
        committed === fresh,
        `the ${service} service's schemas changed (${firstDifference(committed, fresh)}): run ` +
          "`python -m tests.typescript.regenerate` (or `npm run generate`) and adapt the SDK",
      );
    });
  }

  test("a renamed or added field changes the generated text", async () => {
    const document = await served("api");
    const committed = generate("api", document);
    const job = document.components?.schemas?.JobResponse as { properties: Record<string, unknown>; required: string[] };
    const { attempt, ...others } = job.properties;
    job.properties = { ...others, attempts: attempt, added_by_server: { type: "string" } };
    job.required = job.required.map((name) => (name === "attempt" ? "attempts" : name));
    const changed = generate("api", document);
    assert.notEqual(changed, committed);
    assert.match(changed, /\n {2}attempts: number;\n/);
    assert.match(changed, /\n {2}added_by_server\?: string;\n/);
    assert.doesNotMatch(changed.slice(changed.indexOf("interface JobResponse")), /\n {2}attempt: number;/);
  });
});
