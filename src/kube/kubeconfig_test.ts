import assert from "node:assert/strict";
import { loadConfig } from "./kubeconfig.ts";

/** A kubeconfig for `server` whose one user is `user`. */
function kubeconfig(server: string, user: Record<string, unknown> = { token: "t" }, cluster = {}): string {
  return JSON.stringify({
    apiVersion: "v1",
    kind: "Config",
    "current-context": "c",
    contexts: [{ name: "c", context: { cluster: "k", user: "u" } }],
    clusters: [{ name: "k", cluster: { server, "insecure-skip-tls-verify": true, ...cluster } }],
    users: [{ name: "u", user }],
  });
}

async function withDir(fn: (dir: string) => Promise<void>): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "qsp-kubeconfig-" });
  try {
    await fn(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("loadConfig: $KUBECONFIG, then the in-cluster config, then ~/.kube/config (controller-runtime's order)", () =>
  withDir(async (dir) => {
    await Deno.mkdir(`${dir}/home/.kube`, { recursive: true });
    await Deno.writeTextFile(`${dir}/home/.kube/config`, kubeconfig("https://home.example:6443"));
    await Deno.mkdir(`${dir}/sa`);
    await Deno.writeTextFile(`${dir}/sa/token`, "pod-token\n");
    await Deno.writeTextFile(`${dir}/sa/ca.crt`, "CA");
    await Deno.writeTextFile(`${dir}/listed`, kubeconfig("https://listed.example:6443"));
    const vars: Record<string, string> = { HOME: `${dir}/home` };
    const load = () => loadConfig(undefined, { env: (n) => vars[n], serviceAccountDir: `${dir}/sa` });

    assert.equal((await load()).server, "https://home.example:6443");

    Object.assign(vars, { KUBERNETES_SERVICE_HOST: "fd00::1", KUBERNETES_SERVICE_PORT: "443" });
    const pod = await load();
    assert.equal(pod.server, "https://[fd00::1]:443");
    assert.deepEqual(pod.source, {
      path: `${dir}/sa`,
      inCluster: true,
      context: "in-cluster",
      cluster: "in-cluster",
      user: "serviceaccount",
    });
    assert.equal(pod.endpoint.ca, "CA");
    assert.equal((await pod.credentials.get()).headers["Authorization"], "Bearer pod-token");

    // a missing file of the list is skipped, as client-go does
    vars.KUBECONFIG = `${dir}/missing:${dir}/listed`;
    assert.equal((await load()).server, "https://listed.example:6443");
  }));

Deno.test("loadConfig: the proxy is the kubeconfig's proxy-url, else HTTPS_PROXY unless NO_PROXY names the server", () =>
  withDir(async (dir) => {
    const vars: Record<string, string> = { HTTPS_PROXY: "proxy.example:3128", NO_PROXY: "other.example" };
    const proxyOf = async (text: string) => {
      await Deno.writeTextFile(`${dir}/config`, text);
      return (await loadConfig(`${dir}/config`, { env: (n) => vars[n] })).endpoint.proxy?.href;
    };
    assert.equal(await proxyOf(kubeconfig("https://api.example:6443")), "http://proxy.example:3128/");
    assert.equal(
      await proxyOf(kubeconfig("https://api.example:6443", undefined, { "proxy-url": "socks5://s.example:1080" })),
      "socks5://s.example:1080",
    );
    vars.NO_PROXY = "other.example,.example";
    assert.equal(await proxyOf(kubeconfig("https://api.example:6443")), undefined);
  }));

Deno.test("credentials: basic auth and impersonation headers; a tokenFile is read at load, its error names the fix", () =>
  withDir(async (dir) => {
    const load = async (user: Record<string, unknown>) => {
      await Deno.writeTextFile(`${dir}/config`, kubeconfig("https://api.example:6443", user));
      return await loadConfig(`${dir}/config`, { env: () => undefined });
    };
    const basic = await load({ username: "ann", password: "pw", as: "bob", "as-groups": ["g1", "g2"] });
    assert.deepEqual((await basic.credentials.get()).headers, {
      Authorization: `Basic ${btoa("ann:pw")}`,
      "Impersonate-User": "bob",
      "Impersonate-Group": ["g1", "g2"],
    });

    await assert.rejects(
      load({ tokenFile: "token" }),
      new RegExp(
        `^KubeconfigError: kubeconfig ${dir}/config: cannot read tokenFile ${dir}/token of user "u" \\(context "c"\\): ` +
          "no such file: fix the path .* or inline it as token$",
      ),
    );
    await Deno.writeTextFile(`${dir}/token`, "file-token\n");
    const file = await load({ tokenFile: "token" });
    assert.equal((await file.credentials.get()).headers["Authorization"], "Bearer file-token");
  }));
