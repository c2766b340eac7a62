// The Credential Vault (OSEP-0012) through the official OpenSandbox
// JavaScript SDK (@alibaba-group/opensandbox 0.1.11, unchanged): a sandbox
// created with credentialProxy, and sandbox.credentialVault's create, get,
// patch (revisions, a stale expectedRevision), the sanitized list/get
// routes and delete, over direct and server-proxy connections. The SDK
// reaches the vault at the endpoint of port 18080, which moat answers with
// its own egress API (<server>/sandboxes/{id}/proxy/18080).
//
// Run by test/e2e/compatjs_test.go with MOAT_URL, MOAT_API_KEY and
// MOAT_IMAGE. Every request goes to the server on loopback or to the
// sandbox on the test bridge; no traffic goes to the bound hosts (the Go
// e2e test TestCredentialVault covers injection against a fake upstream).

import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";

import { ConnectionConfig, Sandbox, SandboxApiException } from "@alibaba-group/opensandbox";

const URL_ = process.env.MOAT_URL;
const API_KEY = process.env.MOAT_API_KEY;
const IMAGE = process.env.MOAT_IMAGE;
if (!URL_ || !API_KEY || !IMAGE) {
  throw new Error("MOAT_URL, MOAT_API_KEY and MOAT_IMAGE must be set (run through test/e2e/compatjs_test.go)");
}

const SECRET = "js-vault-SECRET-6d1f0c";
const SECRET2 = "js-vault-SECRET2-a93e";

function conn(extra = {}) {
  return new ConnectionConfig({ domain: URL_, apiKey: API_KEY, requestTimeoutSeconds: 60, ...extra });
}

function noSecret(value) {
  const s = JSON.stringify(value);
  assert.ok(!s.includes(SECRET) && !s.includes(SECRET2), `a credential value came back: ${s}`);
}

async function apiError(promise, status, code) {
  let caught;
  await assert.rejects(promise, (err) => {
    caught = err;
    return true;
  });
  assert.ok(caught instanceof SandboxApiException, `want SandboxApiException, got ${caught?.constructor?.name}: ${caught?.message}`);
  assert.equal(caught.statusCode, status, `status of ${caught.message}`);
  assert.equal(caught.error?.code, code, `code of ${caught.message}`);
  assert.ok(!String(caught.message).includes(SECRET), "an error quoted a credential value");
  return caught;
}

const created = [];

async function vaultSandbox(useServerProxy) {
  const sbx = await Sandbox.create({
    connectionConfig: conn({ useServerProxy }),
    image: IMAGE,
    metadata: { suite: `compat-js-vault-${process.pid}` },
    networkPolicy: { defaultAction: "deny", egress: [{ action: "allow", target: "api.vault.test" }, { action: "allow", target: "*.llm.test" }] },
    credentialProxy: { enabled: true },
    resource: { cpu: "250m", memory: "128Mi" },
    readyTimeoutSeconds: 60,
  });
  created.push(sbx);
  return sbx;
}

after(async () => {
  for (const sbx of created) {
    try {
      await sbx.kill();
    } catch {
      // reported by the test that failed
    }
    await sbx.close();
  }
});

// MOAT_UNSUPPORTED=egress (see compat.test.mjs): the runtime has no egress
// enforcement, so the vault, which binds hosts the policy allows, is
// refused with the policy; MOAT_UNSUPPORTED=vault: the runtime enforces
// policies (the kubernetes runtime's egress sidecar) but has no vault.
const unsupported = (process.env.MOAT_UNSUPPORTED ?? "").split(",");
const NO_EGRESS = unsupported.includes("egress") || unsupported.includes("vault");

if (NO_EGRESS) {
  describe("credential vault on a runtime without it", () => {
    it("credentialProxy with networkPolicy is refused (501 SANDBOX::API_NOT_SUPPORTED)", async () => {
      await apiError(
        Sandbox.create({
          connectionConfig: conn(),
          image: IMAGE,
          metadata: { suite: `compat-js-vault-${process.pid}` },
          networkPolicy: { defaultAction: "deny", egress: [{ action: "allow", target: "api.vault.test" }] },
          credentialProxy: { enabled: true },
          readyTimeoutSeconds: 60,
        }),
        501,
        "SANDBOX::API_NOT_SUPPORTED",
      );
    });
  });
}

for (const useServerProxy of NO_EGRESS ? [] : [false, true]) {
  describe(`credential vault through the SDK (useServerProxy=${useServerProxy})`, () => {
    let sbx;
    before(async () => {
      sbx = await vaultSandbox(useServerProxy);
    });

    it("create, read, patch with revisions, delete", async () => {
      const vault = sbx.credentialVault;
      await apiError(vault.get(), 404, "CREDENTIAL_VAULT::NOT_FOUND");

      const state = await vault.create({
        credentials: [
          { name: "gh", source: { type: "inline", value: SECRET } },
          { name: "llm", source: { type: "inline", value: SECRET } },
        ],
        bindings: [
          { name: "github", match: { hosts: ["api.vault.test"], paths: ["/repos/*"] }, auth: { type: "bearer", credential: "gh" } },
          { name: "llm", match: { hosts: ["*.llm.test"] }, auth: { type: "apiKey", name: "x-api-key", credential: "llm" } },
        ],
      });
      noSecret(state);
      assert.equal(state.revision, 1);
      assert.deepEqual(state.credentials.map((c) => [c.name, c.sourceType, c.revision]), [["gh", "inline", 1], ["llm", "inline", 1]]);
      const gh = state.bindings.find((b) => b.name === "github");
      assert.deepEqual(gh.match.hosts, ["api.vault.test"]);
      assert.deepEqual(gh.match.schemes, ["https"]);
      assert.deepEqual(gh.match.paths, ["/repos/*"]);
      assert.deepEqual(gh.auth, { type: "bearer" });
      assert.deepEqual(state.bindings.find((b) => b.name === "llm").auth, { type: "apiKey", name: "X-Api-Key" });

      await apiError(vault.create({ credentials: [], bindings: [] }), 409, "CREDENTIAL_VAULT::ALREADY_EXISTS");
      noSecret(await vault.get());

      const creds = await vault.listCredentials();
      noSecret(creds);
      assert.deepEqual(creds.map((c) => c.name), ["gh", "llm"]);
      assert.deepEqual(await vault.getCredential("gh"), { name: "gh", sourceType: "inline", revision: 1 });
      await apiError(vault.getCredential("nope"), 404, "CREDENTIAL_VAULT::NOT_FOUND");
      const bindings = await vault.listBindings();
      assert.deepEqual(bindings.map((b) => b.name), ["github", "llm"]);
      assert.equal((await vault.getBinding("llm")).match.hosts[0], "*.llm.test");
      await apiError(vault.getBinding("nope"), 404, "CREDENTIAL_VAULT::NOT_FOUND");

      const patched = await vault.patch({
        expectedRevision: 1,
        credentials: { replace: [{ name: "gh", source: { type: "inline", value: SECRET2 } }] },
        bindings: {
          delete: ["llm"],
          add: [{ name: "gh-basic", match: { hosts: ["api.vault.test"], paths: ["/basic/*"] }, auth: { type: "basic", credential: "llm" } }],
        },
      });
      noSecret(patched);
      assert.equal(patched.revision, 2);
      assert.equal(patched.credentials.find((c) => c.name === "gh").revision, 2);
      assert.equal(patched.credentials.find((c) => c.name === "llm").revision, 1);
      assert.deepEqual(patched.bindings.map((b) => b.name), ["gh-basic", "github"]);

      // A stale revision is a conflict and changes nothing.
      await apiError(vault.patch({ expectedRevision: 1, bindings: { delete: ["github"] } }), 409, "CREDENTIAL_VAULT::REVISION_CONFLICT");
      assert.equal((await vault.get()).revision, 2);

      await vault.delete();
      await apiError(vault.get(), 404, "CREDENTIAL_VAULT::NOT_FOUND");
      await apiError(vault.delete(), 404, "CREDENTIAL_VAULT::NOT_FOUND");
    });

    it("bad input is a 400 with {code, message} that quotes no value", async () => {
      const vault = sbx.credentialVault;
      const cred = [{ name: "c", source: { type: "inline", value: SECRET } }];
      for (const [bindings, credentials, what] of [
        [[{ name: "b", match: { hosts: ["api.vault.test"] }, auth: { type: "oauth2", credential: "c" } }], cred, "unsupported auth type"],
        [[{ name: "b", match: { hosts: ["https://api.vault.test/x"] }, auth: { type: "bearer", credential: "c" } }], cred, "not a valid host pattern"],
        [[{ name: "b", match: { hosts: ["api.vault.test"], paths: ["no-slash"] }, auth: { type: "bearer", credential: "c" } }], cred, "must start with /"],
        [[{ name: "b", match: { hosts: ["other.test"] }, auth: { type: "bearer", credential: "c" } }], cred, "not allowed by an explicit allow rule"],
        [[], [{ name: "big", source: { type: "inline", value: SECRET + "x".repeat(9000) } }], "larger than"],
        [[{ name: "b", match: { hosts: ["api.vault.test"] }, auth: { type: "bearer", credential: "missing" } }], cred, "does not exist"],
      ]) {
        const err = await apiError(vault.create({ credentials, bindings }), 400, "CREDENTIAL_VAULT::INVALID_REQUEST");
        assert.ok(err.message.includes(what), `message ${err.message} lacks ${what}`);
      }
      // Nothing was created by the refused requests.
      await apiError(vault.get(), 404, "CREDENTIAL_VAULT::NOT_FOUND");
    });
  });
}

describe("credential vault without credentialProxy", () => {
  // The vault of a sandbox is reached through its egress API, which a
  // runtime without egress policies does not have (upstream without its
  // egress sidecar alike): there the refusal above is the answer.
  (NO_EGRESS ? () => undefined : it)("answers 412 CREDENTIAL_VAULT::NOT_ENABLED", async () => {
    const sbx = await Sandbox.create({
      connectionConfig: conn(),
      image: IMAGE,
      metadata: { suite: `compat-js-vault-${process.pid}` },
      networkPolicy: { defaultAction: "deny", egress: [] },
      resource: { cpu: "250m", memory: "128Mi" },
      readyTimeoutSeconds: 60,
    });
    created.push(sbx);
    await apiError(sbx.credentialVault.get(), 412, "CREDENTIAL_VAULT::NOT_ENABLED");
  });

  it("credentialProxy without networkPolicy is refused at create", async () => {
    await assert.rejects(
      Sandbox.create({ connectionConfig: conn(), image: IMAGE, credentialProxy: { enabled: true }, readyTimeoutSeconds: 30 }),
      (err) => err instanceof SandboxApiException && err.statusCode === 400 && /credentialProxy requires networkPolicy/.test(err.message),
    );
  });
});
