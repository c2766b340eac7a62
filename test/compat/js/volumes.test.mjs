// Named volumes (OpenSandbox's pvc backend) through the official JavaScript
// SDK (@alibaba-group/opensandbox, pinned in package.json), unchanged,
// against a real `moat serve` on the native runtime. Run by
// test/e2e/compatjs_test.go with MOAT_URL, MOAT_API_KEY and MOAT_IMAGE.
//
// The SDK has no volume API (upstream has none); the moat extension
// /v1/volumes is called with fetch to check and clean up.

import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";

import { ConnectionConfig, Sandbox, SandboxApiException, SandboxManager } from "@alibaba-group/opensandbox";

const URL_ = process.env.MOAT_URL;
const API_KEY = process.env.MOAT_API_KEY;
const IMAGE = process.env.MOAT_IMAGE;
if (!URL_ || !API_KEY || !IMAGE) {
  throw new Error("MOAT_URL, MOAT_API_KEY and MOAT_IMAGE must be set (run through test/e2e/compatjs_test.go)");
}

const conn = () => new ConnectionConfig({ domain: URL_, apiKey: API_KEY, requestTimeoutSeconds: 60 });
const suffix = `${process.pid.toString(36)}${Date.now().toString(36)}`;
const CLAIM = `js-shared-${suffix}`;
const SCRATCH = `js-scratch-${suffix}`;

async function volumeApi(method, name) {
  const res = await fetch(`${URL_}/v1/volumes${name ? `/${name}` : ""}`, {
    method,
    headers: { "OPEN-SANDBOX-API-KEY": API_KEY },
  });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : null };
}

function stdoutText(execution) {
  return execution.logs.stdout.map((m) => m.text).join("\n");
}

const created = [];
let manager;

async function create(volumes) {
  const sbx = await Sandbox.create({
    connectionConfig: conn(),
    image: IMAGE,
    entrypoint: ["tail", "-f", "/dev/null"],
    timeoutSeconds: 600,
    readyTimeoutSeconds: 60,
    volumes,
  });
  created.push(sbx);
  return sbx;
}

async function assertRefused(volumes, status, code) {
  await assert.rejects(create(volumes), (err) => {
    assert.ok(err instanceof SandboxApiException, `want SandboxApiException, got ${err?.constructor?.name}: ${err?.message}`);
    assert.equal(err.statusCode, status, `status of ${err.message}`);
    assert.match(JSON.stringify(err.rawBody ?? err.message), new RegExp(code.replace(/:/g, ":")), `code of ${err.message}`);
    return true;
  });
}

before(() => {
  manager = SandboxManager.create({ connectionConfig: conn() });
});

after(async () => {
  for (const sbx of created) {
    try {
      await manager.killSandbox(sbx.id);
    } catch {
      // already gone
    }
    await sbx.close();
  }
  await manager.close();
  await volumeApi("DELETE", CLAIM);
  await volumeApi("DELETE", SCRATCH);
});

describe("pvc volumes through the JavaScript SDK", () => {
  it("two sandboxes share a claim; a read-only mount refuses writes; subPath mounts a directory", async () => {
    const a = await create([
      { name: "data", pvc: { claimName: CLAIM, storage: "64Mi" }, mountPath: "/data" },
      { name: "sub", pvc: { claimName: CLAIM }, mountPath: "/sub", subPath: "nested/dir" },
    ]);
    const w = await a.commands.run("echo from-a > /data/a.txt && echo deep > /sub/d.txt && echo ok");
    assert.equal(stdoutText(w), "ok");
    const b = await create([{ name: "data", pvc: { claimName: CLAIM, createIfNotExists: false }, mountPath: "/data", readOnly: true }]);
    const r = await b.commands.run("cat /data/a.txt /data/nested/dir/d.txt; echo x > /data/b.txt || echo refused");
    assert.equal(stdoutText(r), "from-a\ndeep\nrefused");
    const v = await volumeApi("GET", CLAIM);
    assert.equal(v.status, 200);
    assert.equal(v.body.capacityBytes, 64 * 1024 * 1024);
    assert.deepEqual([...v.body.sandboxes].sort(), [a.id, b.id].sort());
    assert.equal((await volumeApi("DELETE", CLAIM)).status, 409);
  });

  it("the data outlives the sandboxes that wrote it", async () => {
    for (const sbx of created) await manager.killSandbox(sbx.id);
    const c = await create([{ name: "data", pvc: { claimName: CLAIM, createIfNotExists: false }, mountPath: "/data" }]);
    assert.equal(stdoutText(await c.commands.run("cat /data/a.txt")), "from-a");
    await manager.killSandbox(c.id);
    assert.equal((await volumeApi("DELETE", CLAIM)).status, 204);
    assert.equal((await volumeApi("GET", CLAIM)).status, 404);
  });

  it("deleteOnSandboxTermination removes the volume the sandbox created", async () => {
    const d = await create([{ name: "s", pvc: { claimName: SCRATCH, deleteOnSandboxTermination: true }, mountPath: "/s" }]);
    assert.equal((await volumeApi("GET", SCRATCH)).status, 200);
    await manager.killSandbox(d.id);
    assert.equal((await volumeApi("GET", SCRATCH)).status, 404);
  });

  it("bad volumes are refused with their VOLUME codes", async () => {
    await assertRefused([{ name: "data", pvc: { claimName: `js-absent-${suffix}`, createIfNotExists: false }, mountPath: "/data" }], 404, "VOLUME::PVC_NOT_FOUND");
    await assertRefused([{ name: "data", pvc: { claimName: "Not_A_Name" }, mountPath: "/data" }], 400, "VOLUME::INVALID_PVC_NAME");
    await assertRefused([{ name: "data", pvc: { claimName: CLAIM }, mountPath: "/data", subPath: "../../etc" }], 400, "VOLUME::INVALID_SUB_PATH");
    await assertRefused([{ name: "data", pvc: { claimName: CLAIM, storage: "huge" }, mountPath: "/data" }], 400, "VOLUME::INVALID_STORAGE");
    await assertRefused([{ name: "data", ossfs: { bucket: "b", endpoint: "e" }, mountPath: "/data" }], 501, "VOLUME::UNSUPPORTED_BACKEND");
    const list = await volumeApi("GET");
    assert.equal(list.status, 200);
    assert.deepEqual(list.body.items.filter((v) => v.name.startsWith("js-")), [], "refused creates left volumes");
  });
});
