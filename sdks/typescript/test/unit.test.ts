// The parts that need no Evora service: backoff, error mapping, and the retry and timeout
// policy of the transport against a local HTTP server that answers as told.

import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import { formatPosition, linkSignals, parsePosition } from "../src/http.js";
import {
  Client,
  ConflictError,
  EvoraConnectionError,
  EvoraHTTPError,
  JobNotFoundError,
  LeaseLostError,
  RetryBackoff,
  ServerError,
  errorFromResponse,
} from "../src/index.js";

describe("RetryBackoff", () => {
  test("delays grow to the cap and keep at least half the ceiling", () => {
    const backoff = new RetryBackoff({ initialMs: 100, maxMs: 1_000, multiplier: 2 });
    assert.deepEqual(
      [1, 2, 3, 4, 5, 100, 5000].map((n) => backoff.ceiling(n)),
      [100, 200, 400, 800, 1_000, 1_000, 1_000],
    );
    assert.equal(backoff.delay(3, () => 0), 200);
    assert.equal(backoff.delay(3, () => 1), 400);
    assert.throws(() => new RetryBackoff({ initialMs: 0 }), RangeError);
  });
});

describe("errorFromResponse", () => {
  test("maps by code first, then by status", () => {
    const problem = (code: string, status: number) =>
      JSON.stringify({ type: "about:blank", title: "t", status, detail: "d", code });
    const lost = errorFromResponse(409, problem("lease_lost", 409), "Conflict");
    assert.ok(lost instanceof LeaseLostError && lost instanceof ConflictError);
    assert.deepEqual([lost.code, lost.status, lost.detail], ["lease_lost", 409, "d"]);
    const proxy = errorFromResponse(404, "<html>nope</html>", "Not Found");
    assert.ok(!(proxy instanceof JobNotFoundError));
    assert.equal(proxy.code, "http_404");
    assert.equal(proxy.detail, "<html>nope</html>");
    const bare = errorFromResponse(502, "", "Bad Gateway");
    assert.ok(bare instanceof ServerError);
    assert.equal(bare.title, "Bad Gateway");
  });
});

describe("linkSignals", () => {
  test("aborts with either input's reason", () => {
    const a = new AbortController();
    const b = new AbortController();
    const linked = linkSignals(a.signal, b.signal);
    b.abort(new Error("b"));
    assert.equal((linked.signal.reason as Error).message, "b");
    assert.equal(linkSignals(b.signal, a.signal).signal.aborted, true);
  });

  test("leaves nothing behind on a long-lived input once unlinked", () => {
    setFlagsFromString("--expose-gc");
    const gc = runInNewContext("gc") as () => void;
    const stop = new AbortController().signal; // lives as long as a worker
    const link = (count: number): void => {
      for (let i = 0; i < count; i++) linkSignals(new AbortController().signal, stop).unlink();
    };
    const heap = (): number => {
      gc();
      return process.memoryUsage().heapUsed;
    };
    link(2_000);
    const before = heap();
    link(30_000);
    const grown = heap() - before;
    // AbortSignal.any on Node 20 keeps about 60 MB (2 KB a call) for as many calls.
    assert.ok(grown < 5_000_000, `the heap grew by ${(grown / 1e6).toFixed(1)} MB over 30,000 calls`);
  });
});

describe("Evora-Read-After", () => {
  // Each answer carries the next position of `answers` (none when undefined); `sent` keeps
  // the header each request brought.
  let answers: Array<string | undefined> = [];
  const sent: Array<string | undefined> = [];
  const server = createServer((request: IncomingMessage, response: ServerResponse) => {
    sent.push(request.headers["evora-read-after"] as string | undefined);
    const position = answers.shift();
    response.writeHead(200, {
      "Content-Type": "application/json",
      ...(position === undefined ? {} : { "Evora-Read-After": position }),
    });
    response.end('{"id":"x","state":"PENDING"}');
  });
  let url: string;
  before(async () => {
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  after(() => {
    server.closeAllConnections();
    server.close();
  });

  test("a position is PostgreSQL's LSN text, 64 bits", () => {
    assert.equal(parsePosition("16/B374D848"), (0x16n << 32n) | 0xb374d848n);
    assert.equal(formatPosition(parsePosition("ffffffff/ffffffff") ?? 0n), "FFFFFFFF/FFFFFFFF");
    for (const text of ["", "x", "1/2/3", "0/", "123456789/0", "-1/0"]) {
      assert.equal(parsePosition(text), undefined, text);
    }
  });

  test("a Client sends back the highest position it was answered, never a lower one", async () => {
    const client = new Client({ url, retries: 0 });
    const other = new Client({ url, retries: 0 });
    answers = ["0/10", "1/0", "0/FF", undefined, "nonsense"];
    sent.length = 0;
    await client.submit("q", "t");
    await client.get("x");
    await client.get("x"); // answered lower: kept 1/0
    await client.get("x"); // answered nothing
    await client.get("x"); // answered nonsense
    await client.get("x");
    await other.get("x"); // another client: its own position (none yet)
    assert.deepEqual(sent, [undefined, "0/10", "1/0", "1/0", "1/0", "1/0", undefined]);
  });
});

describe("retries and timeouts", () => {
  // Each request gets the next status of `script` (then 200 {"id": "x"}); `hang` ms delays.
  let script: Array<{ status: number; hang?: number }> = [];
  let seen: string[] = [];
  const server = createServer((request: IncomingMessage, response: ServerResponse) => {
    seen.push(`${request.method} ${request.url}`);
    const next = script.shift() ?? { status: 200 };
    setTimeout(() => {
      response.writeHead(next.status, { "Content-Type": "application/json" });
      response.end(next.status === 200 ? '{"id":"x","state":"PENDING"}' : '{"code":"unavailable","title":"t","status":503}');
    }, next.hang ?? 0);
  });
  let client: Client;
  before(async () => {
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const { port } = server.address() as AddressInfo;
    client = new Client({
      url: `http://127.0.0.1:${port}`,
      timeoutMs: 300,
      retries: 2,
      backoff: new RetryBackoff({ initialMs: 1, maxMs: 5 }),
    });
  });
  after(() => {
    server.closeAllConnections();
    server.close();
  });
  const reset = (next: typeof script): void => {
    script = next;
    seen = [];
  };

  test("a GET is repeated after 503s", async () => {
    reset([{ status: 503 }, { status: 503 }]);
    assert.equal((await client.get("x")).id, "x");
    assert.equal(seen.length, 3);
  });

  test("a GET gives up after its retries, saying how often it tried", async () => {
    reset([{ status: 503 }, { status: 503 }, { status: 503 }]);
    const error = await client.get("x").catch((e) => e);
    assert.ok(error instanceof EvoraHTTPError && error.status === 503, String(error));
    assert.equal(error.attempts, 3);
  });

  test("a submit without an idempotency key is not repeated, one with a key is", async () => {
    reset([{ status: 503 }]);
    assert.ok((await client.submit("q", "t").catch((e) => e)) instanceof ServerError);
    assert.equal(seen.length, 1);
    reset([{ status: 503 }]);
    assert.equal((await client.submit("q", "t", {}, { idempotency_key: "k" })).id, "x");
    assert.equal(seen.length, 2);
  });

  test("a call without an answer times out (and is repeated only when safe)", async () => {
    reset([{ status: 200, hang: 2_000 }, { status: 200, hang: 2_000 }, { status: 200, hang: 2_000 }]);
    const began = Date.now();
    const error = await client.submit("q", "t").catch((e) => e);
    assert.ok(error instanceof EvoraConnectionError && error.timedOut && error.requestSent, String(error));
    assert.ok(Date.now() - began < 1_900, "the timeout, not the server, ended the call");
    assert.equal(seen.length, 1);
    reset([{ status: 200, hang: 2_000 }]);
    assert.equal((await client.get("x")).id, "x");
    assert.equal(seen.length, 2);
  });

  test("a refused connection is repeated even for a submit, then reported as not sent", async () => {
    const closed = createServer();
    await new Promise<void>((resolve) => closed.listen(0, "127.0.0.1", resolve));
    const { port } = closed.address() as AddressInfo;
    await new Promise((resolve) => closed.close(resolve));
    const nowhere = new Client({ url: `http://127.0.0.1:${port}`, retries: 2, backoff: new RetryBackoff({ initialMs: 1, maxMs: 5 }) });
    const error = await nowhere.submit("q", "t").catch((e) => e);
    assert.ok(error instanceof EvoraConnectionError && !error.requestSent, String(error));
    assert.equal(error.attempts, 3);
  });
});
