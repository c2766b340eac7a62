// Code contexts in languages other than Python, driven with the official
// OpenSandbox JavaScript SDK (@alibaba-group/opensandbox 0.1.11, pinned in
// package-lock.json, unchanged): the sandbox comes from `Sandbox.create`,
// the agent's endpoint from `getEndpoint(44772)`, and every code-context
// call goes through the SDK's own generated execd client
// (`createExecdClient` from `@alibaba-group/opensandbox/internal`, typed by
// the SDK's OpenAPI `paths`), the way the separate code-interpreter SDK
// (not published on npm) builds on it. The stream is parsed here as that
// SDK does: one JSON event per line, an optional `data: ` prefix.
//
// test/e2e/compatjs_code_test.go starts the server and runs this file (from
// test/compat/js, whose node_modules hold the SDK) with:
//   MOAT_URL, MOAT_API_KEY  the server and its key
//   MOAT_CODE_IMAGE         the debian-kernels test image (scripts/build-test-images.sh):
//                           IRkernel (R) and tslab (TypeScript) Jupyter kernels,
//                           a JDK for the jshell driver, node for JavaScript
//
// Every request goes to loopback (the server) or to the sandbox's own IP on
// the test server's bridge.

import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";

import { ConnectionConfig, Sandbox } from "@alibaba-group/opensandbox";
import { createExecdClient } from "@alibaba-group/opensandbox/internal";

const URL_ = process.env.MOAT_URL;
const API_KEY = process.env.MOAT_API_KEY;
const IMAGE = process.env.MOAT_CODE_IMAGE;
if (!URL_ || !API_KEY || !IMAGE) {
  throw new Error("MOAT_URL, MOAT_API_KEY and MOAT_CODE_IMAGE must be set (run through test/e2e/compatjs_code_test.go)");
}

const conn = () => new ConnectionConfig({ domain: URL_, apiKey: API_KEY, requestTimeoutSeconds: 120 });

// Reads an execd event stream to its end (pings dropped).
async function readEvents(res) {
  assert.equal(res.status, 200, `stream status ${res.status}`);
  const events = [];
  const decoder = new TextDecoder();
  let buf = "";
  for await (const chunk of res.body) {
    buf += decoder.decode(chunk, { stream: true });
    let i;
    while ((i = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, i).trim().replace(/^data: /, "");
      buf = buf.slice(i + 1);
      if (!line) continue;
      const ev = JSON.parse(line);
      if (ev.type !== "ping") events.push(ev);
    }
  }
  return events;
}

const stdout = (evs) => evs.filter((e) => e.type === "stdout").map((e) => e.text).join("");
const result = (evs) => evs.find((e) => e.type === "result")?.results?.text ?? "";

// Per language: state, output, value, error, and an interrupt sent right
// after the init event.
const LANGS = [
  { language: "java", define: "int x = 41;", use: "System.out.println(x + 1);\nx + 1", result: "42",
    fail: "Object o = null;\no.hashCode();", ename: "EvalException", loop: "while (true) {}" },
  { language: "typescript", define: "let x: number = 41", use: "console.log(x + 1)", result: "",
    fail: "throw new RangeError(\"no\")", ename: "Error", loop: "while (true) {}" },
  { language: "r", define: "x <- 41", use: "cat(x + 1, \"\\n\", sep = \"\")\nx + 1", result: "42",
    fail: "stop(\"no\")", ename: "ERROR", loop: "while (TRUE) {}" },
  { language: "javascript", define: "var x = 41", use: "console.log(x + 1); x + 1", result: "42",
    fail: "null.f()", ename: "TypeError", loop: "for (;;) {}" },
];

describe("code contexts beyond Python (SDK execd client)", () => {
  /** @type {Sandbox} */
  let sbx;
  let execd;

  before(async () => {
    sbx = await Sandbox.create({
      connectionConfig: conn(),
      image: IMAGE,
      entrypoint: ["sleep", "infinity"],
      timeoutSeconds: 900,
      readyTimeoutSeconds: 120,
    });
    const ep = await sbx.getEndpoint(44772);
    execd = createExecdClient({ baseUrl: `http://${ep.endpoint}`, headers: ep.headers ?? {} });
  });

  after(async () => {
    if (sbx) {
      await sbx.kill().catch(() => {});
      await sbx.close();
    }
  });

  const run = async (id, code) => {
    const { response } = await execd.POST("/code", { body: { context: { id }, code }, parseAs: "stream" });
    return readEvents(response);
  };

  for (const l of LANGS) {
    it(`${l.language}: context, state, output, value, error, interrupt right after init`, async () => {
      const { data: ctx, error, response } = await execd.POST("/code/context", { body: { language: l.language } });
      assert.equal(response.status, 200, JSON.stringify(error));
      assert.match(ctx.id, /^[0-9a-f]{32}$/);
      assert.equal(ctx.language, l.language);

      const { data: got } = await execd.GET("/code/contexts/{context_id}", { params: { path: { context_id: ctx.id } } });
      assert.equal(got.id, ctx.id);

      let evs = await run(ctx.id, l.define);
      assert.equal(evs[0].type, "init");
      assert.equal(evs[0].text, ctx.id);
      assert.equal(evs.at(-1).type, "execution_complete");

      evs = await run(ctx.id, l.use);
      assert.match(stdout(evs), /^42/);
      if (l.result) assert.match(result(evs), new RegExp(l.result));
      assert.equal(evs.at(-1).type, "execution_complete");

      evs = await run(ctx.id, l.fail);
      const last = evs.at(-1);
      assert.equal(last.type, "error", JSON.stringify(evs));
      assert.ok(last.error.ename.includes(l.ename), `ename ${last.error.ename}`);

      // Interrupt as soon as init has arrived.
      const { response: live } = await execd.POST("/code", { body: { context: { id: ctx.id }, code: l.loop }, parseAs: "stream" });
      const reader = live.body.getReader();
      const decoder = new TextDecoder();
      let head = "";
      while (!head.includes("\n")) {
        const { value, done } = await reader.read();
        assert.ok(!done, "stream ended before init");
        head += decoder.decode(value, { stream: true });
      }
      assert.equal(JSON.parse(head.slice(0, head.indexOf("\n")).replace(/^data: /, "")).type, "init");
      const { response: intr } = await execd.DELETE("/code", { params: { query: { id: ctx.id } } });
      assert.equal(intr.status, 200);
      let rest = head.slice(head.indexOf("\n") + 1);
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        rest += decoder.decode(value, { stream: true });
      }
      const tail = rest.split("\n").map((s) => s.trim().replace(/^data: /, "")).filter(Boolean).map((s) => JSON.parse(s))
        .filter((e) => e.type !== "ping");
      assert.equal(tail.at(-1).type, "error", `interrupted loop ended with ${JSON.stringify(tail.at(-1))}`);

      evs = await run(ctx.id, l.use);
      assert.match(stdout(evs), /^42/, "the context works after the interrupt");

      const { data: list } = await execd.GET("/code/contexts", { params: { query: { language: l.language } } });
      assert.ok(list.some((c) => c.id === ctx.id));
      const { response: del } = await execd.DELETE("/code/contexts/{context_id}", { params: { path: { context_id: ctx.id } } });
      assert.equal(del.status, 200);
      const { response: gone } = await execd.GET("/code/contexts/{context_id}", { params: { path: { context_id: ctx.id } } });
      assert.equal(gone.status, 404);
    });
  }

  it("a language without a kernel or driver is refused with {code, message}", async () => {
    const { error, response } = await execd.POST("/code/context", { body: { language: "go" } });
    assert.equal(response.status, 501);
    assert.equal(error.code, "RUNTIME_ERROR");
    assert.match(error.message, /no Jupyter kernel for go/);
  });

  it("contexts of several languages run at the same time", async () => {
    const ids = {};
    for (const l of LANGS) {
      const { data } = await execd.POST("/code/context", { body: { language: l.language } });
      ids[l.language] = data.id;
      await run(data.id, l.define);
    }
    const outs = await Promise.all(LANGS.map((l) => run(ids[l.language], l.use)));
    outs.forEach((evs, i) => assert.match(stdout(evs), /^42/, `${LANGS[i].language}: ${stdout(evs)}`));
    for (const l of LANGS) {
      const { response } = await execd.DELETE("/code/contexts", { params: { query: { language: l.language } } });
      assert.equal(response.status, 200);
    }
  });
});
