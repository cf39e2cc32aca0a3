// `npm run generate`: rewrites src/generated/{api,dispatcher}.ts from the services'
// /openapi.json. Sources are URLs of running services (EVORA_API_URL and
// EVORA_DISPATCHER_URL, defaulting to `evora dev`'s ports) or saved documents given as
// `api=FILE dispatcher=FILE`.
import { readFile, writeFile } from "node:fs/promises";
import { generate, type OpenApiDocument } from "./codegen.js";

export const SERVICES = ["api", "dispatcher"] as const;
export type Service = (typeof SERVICES)[number];

const DEFAULT_URLS: Record<Service, string> = {
  api: process.env.EVORA_API_URL ?? "http://127.0.0.1:8080",
  dispatcher: process.env.EVORA_DISPATCHER_URL ?? "http://127.0.0.1:8081",
};

/** The committed module of a service, as a path relative to the package root. */
export function generatedPath(service: Service): URL {
  return new URL(`../../src/generated/${service}.ts`, import.meta.url);
}

export async function fetchDocument(baseUrl: string): Promise<OpenApiDocument> {
  const response = await fetch(`${baseUrl.replace(/\/$/, "")}/openapi.json`, {
    signal: AbortSignal.timeout(10_000),
  });
  if (!response.ok) throw new Error(`${baseUrl}/openapi.json answered ${response.status}`);
  return (await response.json()) as OpenApiDocument;
}

async function load(service: Service, files: Map<string, string>): Promise<OpenApiDocument> {
  const file = files.get(service);
  if (file !== undefined) return JSON.parse(await readFile(file, "utf8")) as OpenApiDocument;
  return fetchDocument(DEFAULT_URLS[service]);
}

async function main(args: string[]): Promise<void> {
  const files = new Map(args.map((arg) => arg.split("=", 2) as [string, string]));
  for (const service of SERVICES) {
    const target = generatedPath(service);
    await writeFile(target, generate(service, await load(service, files)));
    console.log(`wrote ${target.pathname}`);
  }
}

if (process.argv[1] === new URL(import.meta.url).pathname) {
  await main(process.argv.slice(2));
}
