import assert from "node:assert/strict";
import { type ControlPlane, startControlPlane } from "./controlplane.ts";

// Reads the client credentials back out of a kubeconfig, so the test exercises the files users actually get.
async function clientFromKubeconfig(path: string): Promise<Deno.HttpClient> {
  const text = await Deno.readTextFile(path);
  const field = (name: string) => {
    const m = text.match(new RegExp(`${name}: (\\S+)`));
    assert.ok(m, `${name} missing from ${path}`);
    return atob(m[1]);
  };
  return Deno.createHttpClient({
    caCerts: [field("certificate-authority-data")],
    cert: field("client-certificate-data"),
    key: field("client-key-data"),
  });
}

async function statusOf(url: string, client: Deno.HttpClient): Promise<number> {
  const res = await fetch(url, { client });
  await res.body?.cancel();
  return res.status;
}

function pidAlive(pid: number): boolean {
  try {
    Deno.statSync(`/proc/${pid}`);
    return true;
  } catch {
    return false;
  }
}

Deno.test("control plane serves TLS with client-cert authn and RBAC, and stops cleanly", async () => {
  const dir = await Deno.makeTempDir({ prefix: "qsp-controlplane-" });
  let cp: ControlPlane | undefined;
  const clients: Deno.HttpClient[] = [];
  try {
    const t0 = performance.now();
    cp = await startControlPlane({ dir });
    console.log(`control plane ready in ${Math.round(performance.now() - t0)} ms at ${cp.server}`);
    const pids = ["etcd", "kube-apiserver", "kube-controller-manager"].map((n) =>
      Number(Deno.readTextFileSync(`${dir}/${n}.pid`).trim())
    );
    const namespaces = `${cp.server}/api/v1/namespaces`;

    const admin = await clientFromKubeconfig(cp.kubeconfigPath);
    clients.push(admin);
    const res = await fetch(namespaces, { client: admin });
    assert.equal(res.status, 200);
    const names = (await res.json()).items.map((ns: { metadata: { name: string } }) => ns.metadata.name);
    assert.ok(names.includes("default"), `namespaces: ${names}`);

    const nobody = await clientFromKubeconfig(await cp.userKubeconfig("nobody", ["some-team"]));
    clients.push(nobody);
    assert.equal(await statusOf(namespaces, nobody), 403);

    const anonymous = Deno.createHttpClient({ caCerts: [await Deno.readTextFile(cp.caCertPath)] });
    clients.push(anonymous);
    assert.ok([401, 403].includes(await statusOf(namespaces, anonymous)));

    await cp.stop();
    cp = undefined;
    assert.deepEqual(pids.filter(pidAlive), []);
  } finally {
    for (const c of clients) c.close();
    await cp?.stop();
    await Deno.remove(dir, { recursive: true });
  }
});
