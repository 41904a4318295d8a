/**
 * The real Jumpstarter controller v0.7.1 against the test control plane: it issues exporter credentials, its CA bundle
 * is published and verifies both of its endpoints at the lab bridge address, token Secrets of deleted Exporters are
 * collected, a restart brings new certificates but keeps tokens valid, and stopping leaves its ports free.
 */
import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import { freshNamespace, testEnv, waitFor } from "../env.ts";
import { CA_CONFIGMAP, type RealJumpstarter, startRealJumpstarter } from "./controller.ts";
import { KubeClient } from "../../src/kube/client.ts";
import { CONFIG_MAPS, EXPORTERS, SECRETS } from "../../src/kube/resources.ts";
import type { ConfigMap, Exporter, Secret } from "../../src/api/types.ts";

const secs = (t0: number) => `${((performance.now() - t0) / 1000).toFixed(1)} s`;

Deno.test("real Jumpstarter controller: credentials, CA bundle, token cleanup, restart, stop", async () => {
  const env = await testEnv();
  const client = await KubeClient.load(env.kubeconfig);
  const bridge = `${env.labNet.subnet}.1`;
  const jsNamespace = await freshNamespace(client, "js");
  const ns = await freshNamespace(client, "jsexp");
  const dir = await Deno.makeTempDir({ prefix: "qsp-jumpstarter-" });
  const opts = { kubeconfig: env.kubeconfig, namespace: jsNamespace, bridgeAddress: bridge, dir };

  let t0 = performance.now();
  const js = await startRealJumpstarter(opts);
  console.error(`[jumpstarter] ready (CA published, an exporter accepted) after ${secs(t0)}`);
  try {
    assert.equal(js.endpoint, `${bridge}:8082`);
    await assertCaPublished(client, jsNamespace, js);

    await assert.rejects(startRealJumpstarter(opts), /port 8082 \(Jumpstarter grpc\) is in use by .*jumpstarter-con/);

    t0 = performance.now();
    const first = await createExporter(client, ns, "e1");
    const firstToken = await issuedToken(client, js, first);
    console.error(`[jumpstarter] credential issued after ${secs(t0)}`);

    await client.delete(EXPORTERS, ns, "e1");
    await waitFor(async () => !await client.find(SECRETS, ns, "e1-exporter"), { what: "e1-exporter collected" });
    const second = await createExporter(client, ns, "e1");
    const secondToken = await issuedToken(client, js, second);
    assert.notEqual(secondToken, firstToken);

    const oldCa = js.caBundle();
    t0 = performance.now();
    await js.restart();
    console.error(`[jumpstarter] restarted and ready after ${secs(t0)}`);
    assert.notEqual(js.caBundle(), oldCa);
    await assertCaPublished(client, jsNamespace, js);
    // A credential for a new Exporter shows the restarted controller has worked through its queue.
    await issuedToken(client, js, await createExporter(client, ns, "e2"));
    assert.equal(await token(client, ns, "e1"), secondToken, "the signing key survives restarts, so tokens do too");
  } finally {
    await js.stop();
    client.close();
  }
  for (const port of [8082, 8083, 8084]) Deno.listen({ port }).close();
  Deno.listen({ hostname: "127.0.0.1", port: 8085 }).close();
  await Deno.remove(dir, { recursive: true });
});

function createExporter(client: KubeClient, namespace: string, name: string): Promise<Exporter> {
  return client.create<Exporter>(EXPORTERS, { metadata: { name, namespace }, spec: { enabled: true } });
}

async function token(client: KubeClient, namespace: string, exporter: string): Promise<string | undefined> {
  const data = (await client.find<Secret>(SECRETS, namespace, `${exporter}-exporter`))?.data?.token;
  return data && Buffer.from(data, "base64").toString();
}

/** Waits for the controller's credential for `exporter` and checks it names this very Exporter. */
async function issuedToken(client: KubeClient, js: RealJumpstarter, exporter: Exporter): Promise<string> {
  const { namespace, name, uid } = exporter.metadata;
  const status = await waitFor(async () => {
    const s = (await client.get<Exporter>(EXPORTERS, namespace, name!)).status;
    return s?.credential && s.endpoint ? s : undefined;
  }, { what: `credential of ${name}` });
  assert.equal(status.credential!.name, `${name}-exporter`);
  assert.equal(status.endpoint, js.endpoint);
  const secret = await client.get<Secret>(SECRETS, namespace, `${name}-exporter`);
  assert.deepEqual(secret.metadata.ownerReferences?.map((o) => [o.kind, o.name, o.uid, o.controller]), [
    ["Exporter", name, uid, true],
  ]);
  const jwt = (await token(client, namespace!, name!))!;
  const claims = JSON.parse(Buffer.from(jwt.split(".")[1], "base64url").toString());
  assert.equal(claims.sub, `exporter:${namespace}:${name}:${uid}`);
  return jwt;
}

/** The ConfigMap holds the running certificates, and they verify the endpoints exporters dial. */
async function assertCaPublished(client: KubeClient, namespace: string, js: RealJumpstarter) {
  const cm = await client.get<ConfigMap>(CONFIG_MAPS, namespace, CA_CONFIGMAP.name);
  assert.equal(cm.data?.[CA_CONFIGMAP.key], js.caBundle());
  assert.equal(js.caBundle().match(/BEGIN CERTIFICATE/g)?.length, 2);
  const caFile = await Deno.makeTempFile({ suffix: ".pem" });
  try {
    await Deno.writeTextFile(caFile, js.caBundle());
    for (const endpoint of [js.endpoint, js.routerEndpoint]) {
      const [host] = endpoint.split(":");
      const out = await new Deno.Command("openssl", {
        args: [
          "s_client",
          "-connect",
          endpoint,
          "-alpn",
          "h2",
          "-CAfile",
          caFile,
          "-verify_ip",
          host,
          "-verify_return_error",
        ],
        stdin: "null",
        stdout: "piped",
        stderr: "piped",
      }).output();
      const text = new TextDecoder().decode(out.stdout);
      assert.ok(out.success && text.includes("Verify return code: 0 (ok)"), `TLS to ${endpoint}:\n${text}`);
    }
  } finally {
    await Deno.remove(caFile);
  }
}
