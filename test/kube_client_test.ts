/**
 * KubeClient against the real API server: kubeconfig loading with each kind of credential the server can check here
 * (client certificate, bearer token, tokenFile, exec plugin), tls-server-name, insecure-skip-tls-verify, proxy-url,
 * in-cluster config, the errors of run.ts's loadClient and preflight, request deadlines on a half-dead link, and watches
 * that end cleanly however they are stopped. Deno's resource and op sanitizers stay on: a leaked response body, timer or connection
 * fails the test.
 */
import assert from "node:assert/strict";
import { parse, stringify } from "yaml";
import { freshNamespace, testEnv } from "./env.ts";
import { FaultInjector } from "./faultproxy.ts";
import { KubeClient, type Resource } from "../src/kube/client.ts";
import { KubeConnectError } from "../src/kube/transport.ts";
import { loadClient, preflight } from "../src/run.ts";
import { connectProxy, forwarder, socks5Proxy } from "./proxies.ts";
import { CONFIG_MAPS } from "../src/kube/resources.ts";
import type { KubeObject } from "../src/api/types.ts";

const SERVICE_ACCOUNTS: Resource = { group: "", version: "v1", plural: "serviceaccounts", kind: "ServiceAccount" };
const SELF_SUBJECT_REVIEWS: Resource = {
  group: "authentication.k8s.io",
  version: "v1",
  plural: "selfsubjectreviews",
  kind: "SelfSubjectReview",
};

interface UserInfo {
  username: string;
  groups?: string[];
}

async function whoAmI(client: KubeClient): Promise<UserInfo> {
  const review = await client.create<KubeObject & { status: { userInfo: UserInfo } }>(
    SELF_SUBJECT_REVIEWS,
    { metadata: {} } as KubeObject & { status: { userInfo: UserInfo } },
  );
  return review.status.userInfo;
}

/** A short-lived ServiceAccount token from the TokenRequest API, which the server signs and checks itself. */
async function serviceAccountToken(admin: KubeClient, ns: string, name: string): Promise<string> {
  await admin.create(SERVICE_ACCOUNTS, { metadata: { name, namespace: ns } });
  const req = await admin.request<{ status: { token: string } }>(
    "POST",
    `/api/v1/namespaces/${ns}/serviceaccounts/${name}/token`,
    { body: { apiVersion: "authentication.k8s.io/v1", kind: "TokenRequest", spec: { expirationSeconds: 3600 } } },
  );
  return req.status.token;
}

/** The test kubeconfig changed by `edit`, in a directory of its own (for relative paths); removed after `fn`. */
async function withConfig<T>(
  kubeconfig: string,
  edit: (config: Kubeconfig, dir: string) => void | Promise<void>,
  fn: (path: string) => Promise<T>,
): Promise<T> {
  const config = parse(await Deno.readTextFile(kubeconfig)) as Kubeconfig;
  const dir = await Deno.makeTempDir({ prefix: "qsp-kube-client-" });
  try {
    await edit(config, dir);
    const path = `${dir}/kubeconfig`;
    await Deno.writeTextFile(path, stringify(config), { mode: 0o600 });
    return await fn(path);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

interface Kubeconfig {
  clusters: { name: string; cluster: Record<string, unknown> }[];
  users: { name: string; user: Record<string, unknown> }[];
  contexts: { name: string; context: Record<string, unknown> }[];
  "current-context": string;
}

/** The test kubeconfig with its user's credentials replaced; removed again after `fn`. */
function withUser<T>(kubeconfig: string, user: Record<string, unknown>, fn: (path: string) => Promise<T>): Promise<T> {
  return withConfig(kubeconfig, (config) => {
    for (const u of config.users) u.user = user;
  }, fn);
}

/** The test kubeconfig with its cluster changed by `edit`. */
function withCluster<T>(
  kubeconfig: string,
  edit: (cluster: Record<string, unknown>) => void,
  fn: (path: string) => Promise<T>,
): Promise<T> {
  return withConfig(kubeconfig, (config) => {
    for (const c of config.clusters) edit(c.cluster);
  }, fn);
}

async function loadAndAsk(path: string): Promise<UserInfo> {
  const client = await KubeClient.load(path);
  try {
    return await whoAmI(client);
  } finally {
    client.close();
  }
}

Deno.test("client: the test kubeconfig loads, and client-certificate authentication works", async () => {
  const env = await testEnv();
  const client = await KubeClient.load(env.kubeconfig);
  try {
    assert.match(client.server, /^https:\/\/127\.0\.0\.1:\d+$/);
    const me = await whoAmI(client);
    assert.equal(me.username, "admin");
    assert.ok(me.groups?.includes("system:masters"), JSON.stringify(me));
  } finally {
    client.close();
  }
});

Deno.test("client: bearer tokens work: inline, tokenFile and exec credential plugins", async () => {
  const env = await testEnv();
  const admin = await KubeClient.load(env.kubeconfig);
  try {
    const ns = await freshNamespace(admin, "kcli");
    const token = await serviceAccountToken(admin, ns, "robot");
    const expected = `system:serviceaccount:${ns}:robot`;

    assert.equal((await withUser(env.kubeconfig, { token }, loadAndAsk)).username, expected);

    const credential = JSON.stringify({
      apiVersion: "client.authentication.k8s.io/v1",
      kind: "ExecCredential",
      status: { token },
    });
    const exec = {
      apiVersion: "client.authentication.k8s.io/v1",
      command: "sh",
      args: ["-c", 'printf "%s" "$CREDENTIAL"'],
      env: [{ name: "CREDENTIAL", value: credential }],
      interactiveMode: "Never",
    };
    assert.equal((await withUser(env.kubeconfig, { exec }, loadAndAsk)).username, expected);

    // client-go's field is tokenFile (re-read once a minute); client-node's token-file is read too
    const tokenFile = await Deno.makeTempFile({ prefix: "qsp-kube-token-" });
    try {
      await Deno.writeTextFile(tokenFile, token);
      assert.equal((await withUser(env.kubeconfig, { tokenFile }, loadAndAsk)).username, expected);
      assert.equal((await withUser(env.kubeconfig, { "token-file": tokenFile }, loadAndAsk)).username, expected);
    } finally {
      await Deno.remove(tokenFile);
    }

    // An exec plugin as a script next to the kubeconfig, named by a relative path (client-go resolves it against the
    // kubeconfig's directory), which sees KUBERNETES_EXEC_INFO.
    const script = (dir: string) =>
      Deno.writeTextFile(
        `${dir}/credential.sh`,
        `#!/bin/sh\ncase "$KUBERNETES_EXEC_INFO" in *ExecCredential*) ;; *) echo "no exec info" >&2; exit 3;; esac\n` +
          `printf '%s' '${credential}'\n`,
        { mode: 0o755 },
      );
    const viaScript = await withConfig(env.kubeconfig, async (config, dir) => {
      await script(dir);
      for (const u of config.users) {
        u.user = { exec: { apiVersion: "client.authentication.k8s.io/v1", command: "./credential.sh" } };
      }
    }, loadAndAsk);
    assert.equal(viaScript.username, expected);
  } finally {
    admin.close();
  }
});

Deno.test("client: tls-server-name, insecure-skip-tls-verify, proxy-url (HTTP CONNECT and SOCKS5)", async () => {
  const env = await testEnv();
  const api = new URL(
    (parse(await Deno.readTextFile(env.kubeconfig)) as Kubeconfig).clusters[0].cluster.server as string,
  );
  // 127.0.0.2 is not in the API server's certificate (127.0.0.1, localhost): only tls-server-name makes it pass
  const fwd = forwarder("127.0.0.2", api.host);
  const http = connectProxy();
  const socks = socks5Proxy();
  try {
    const viaOtherAddress = (c: Record<string, unknown>) => c.server = `https://127.0.0.2:${fwd.port}`;
    await assert.rejects(
      withCluster(env.kubeconfig, viaOtherAddress, loadAndAsk),
      (e: Error) => e instanceof KubeConnectError && e.code === "ERR_TLS_CERT_ALTNAME_INVALID",
    );
    const named = await withCluster(env.kubeconfig, (c) => {
      viaOtherAddress(c);
      c["tls-server-name"] = "localhost";
    }, loadAndAsk);
    assert.equal(named.username, "admin");

    // no CA at all: refused, unless verification is skipped
    const noCa = (c: Record<string, unknown>) => delete c["certificate-authority-data"];
    await assert.rejects(
      withCluster(env.kubeconfig, noCa, loadAndAsk),
      (e: Error) => e instanceof KubeConnectError && e.tls,
    );
    const skipped = await withCluster(env.kubeconfig, (c) => {
      noCa(c);
      c["insecure-skip-tls-verify"] = true;
    }, loadAndAsk);
    assert.equal(skipped.username, "admin");

    for (
      const [proxy, url] of [[http, `http://127.0.0.1:${http.port}`], [
        socks,
        `socks5://127.0.0.1:${socks.port}`,
      ]] as const
    ) {
      await withCluster(env.kubeconfig, (c) => c["proxy-url"] = url, async (path) => {
        const client = await KubeClient.load(path);
        try {
          assert.equal((await whoAmI(client)).username, "admin");
          // a watch through the proxy still ends at once on abort
          const ac = new AbortController();
          const watching = (async () => {
            for await (const ev of client.watch(CONFIG_MAPS, "default", { resourceVersion: "0" }, ac.signal)) {
              if (ev.type) setTimeout(() => ac.abort(), 100);
            }
          })();
          const t0 = performance.now();
          await assert.rejects(watching, (e: Error) => e.name === "AbortError");
          assert.ok(performance.now() - t0 < 5000);
        } finally {
          client.close();
        }
      });
      assert.ok(proxy.targets.includes(api.host), `${url} was asked for ${proxy.targets.join(", ")}`);
    }

    // both at once: the proxy is asked for the server's address, the certificate checked for tls-server-name
    const both = await withCluster(env.kubeconfig, (c) => {
      viaOtherAddress(c);
      c["tls-server-name"] = "localhost";
      c["proxy-url"] = `http://127.0.0.1:${http.port}`;
    }, loadAndAsk);
    assert.equal(both.username, "admin");
    assert.ok(http.targets.includes(`127.0.0.2:${fwd.port}`));
  } finally {
    await Promise.all([fwd.close(), http.close(), socks.close()]);
  }
});

Deno.test("client: in-cluster config from KUBERNETES_SERVICE_HOST/PORT and a service account directory", async () => {
  const env = await testEnv();
  const admin = await KubeClient.load(env.kubeconfig);
  const sa = await Deno.makeTempDir({ prefix: "qsp-sa-" });
  try {
    const ns = await freshNamespace(admin, "kcli");
    await Deno.writeTextFile(`${sa}/token`, await serviceAccountToken(admin, ns, "pod"));
    const cluster = (parse(await Deno.readTextFile(env.kubeconfig)) as Kubeconfig).clusters[0].cluster;
    await Deno.writeTextFile(`${sa}/ca.crt`, atob(cluster["certificate-authority-data"] as string));
    const api = new URL(cluster.server as string);
    const vars: Record<string, string> = { KUBERNETES_SERVICE_HOST: api.hostname, KUBERNETES_SERVICE_PORT: api.port };
    const client = await KubeClient.load(undefined, { env: (n) => vars[n], serviceAccountDir: sa });
    try {
      assert.equal(client.source.inCluster, true);
      assert.equal((await whoAmI(client)).username, `system:serviceaccount:${ns}:pod`);
    } finally {
      client.close();
    }
  } finally {
    await Deno.remove(sa, { recursive: true });
    admin.close();
  }
});

Deno.test("client: errors name the file, the context and the fix", async () => {
  const env = await testEnv();
  const errors: string[] = [];
  const failsWith = async (p: Promise<unknown>, re: RegExp) => {
    const e = await p.then(() => undefined, (e: Error) => e);
    assert.ok(e instanceof Error, `expected ${re}, got success`);
    errors.push(e.message);
    assert.match(e.message, re);
    assert.ok(!e.message.includes("\n"), e.message);
  };
  const home = await Deno.makeTempDir({ prefix: "qsp-home-" });
  try {
    // nothing anywhere
    await failsWith(
      loadClient(undefined, { env: (n) => ({ HOME: home } as Record<string, string>)[n] }),
      new RegExp(
        "^no kubeconfig found; tried --kubeconfig \\(not given\\), \\$KUBECONFIG \\(not set\\), in-cluster config " +
          `\\(KUBERNETES_SERVICE_HOST not set\\), ${home}/\\.kube/config \\(no such file\\): pass --kubeconfig FILE`,
      ),
    );
    await failsWith(
      loadClient(`${home}/nope`),
      /^cannot read kubeconfig .*nope \(--kubeconfig\): no such file: fix the path$/,
    );
    await failsWith(
      loadClient(undefined, {
        env: (n) => ({ KUBECONFIG: `${home}/a:${home}/b`, HOME: home } as Record<string, string>)[n],
      }),
      /\$KUBECONFIG=.*\/a:.*\/b \(no such files\)/,
    );
    // the context
    await withConfig(
      env.kubeconfig,
      (c) => void (c["current-context"] = "gone"),
      (path) =>
        failsWith(
          loadClient(path),
          new RegExp(
            `^kubeconfig ${path}: context "gone" \\(current-context of ${path}, contexts: \\S+\\) does not exist`,
          ),
        ),
    );
    await withConfig(
      env.kubeconfig,
      (c) => void (c["current-context"] = ""),
      (path) =>
        failsWith(loadClient(path), new RegExp(`^kubeconfig ${path} has no current-context \\(contexts: \\S+\\): run`)),
    );
    // a certificate file that is not there, by a relative path
    await withConfig(env.kubeconfig, (c) => {
      for (const u of c.users) {
        delete u.user["client-certificate-data"];
        u.user["client-certificate"] = "certs/admin.crt";
      }
    }, (path) =>
      failsWith(
        loadClient(path),
        new RegExp(
          `^kubeconfig ${path}: cannot read client-certificate ${
            path.replace(/kubeconfig$/, "")
          }certs/admin.crt of user ` +
            '"\\S+" \\(context "\\S+"\\): no such file: fix the path .* or inline it as client-certificate-data$',
        ),
      ));
    // an exec plugin that fails
    await withUser(env.kubeconfig, {
      exec: {
        apiVersion: "client.authentication.k8s.io/v1",
        command: "sh",
        args: ["-c", "echo 'token expired, run login' >&2; exit 2"],
      },
    }, async (path) => {
      const client = await loadClient(path);
      try {
        await failsWith(
          preflight(client, [CONFIG_MAPS], "default"),
          /^exec plugin sh of user "\S+" \(kubeconfig .*, context "\S+"\) exited with 2: token expired, run login$/,
        );
      } finally {
        client.close();
      }
    });

    // unreachable: a closed loopback port, a name that does not resolve, a certificate not trusted
    const closed = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    const port = (closed.addr as Deno.NetAddr).port;
    closed.close();
    const unreachable = async (
      server: string,
      edit: (c: Record<string, unknown>) => void,
      re: RegExp,
      connectTimeoutMs = 2000,
    ) => {
      await withCluster(env.kubeconfig, (c) => {
        c.server = server;
        edit(c);
      }, async (path) => {
        const client = await loadClient(path, { connectTimeoutMs });
        try {
          await failsWith(preflight(client, [CONFIG_MAPS], "default"), re);
        } finally {
          client.close();
        }
      });
    };
    await unreachable(
      `https://127.0.0.1:${port}`,
      () => {},
      new RegExp(
        `^cannot reach the API server https://127\\.0\\.0\\.1:${port} \\(kubeconfig \\S+, context "\\S+"\\): ` +
          `127\\.0\\.0\\.1:${port}: connection refused \\(ECONNREFUSED\\): is the API server running`,
      ),
    );
    await unreachable(
      "https://api.qsp-test.invalid:6443",
      () => {},
      /api\.qsp-test\.invalid:6443: cannot resolve api\.qsp-test\.invalid \(ENOTFOUND\): check the host name/,
    );
    // a server that accepts the connection and then says nothing
    const mute = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    const held: Deno.Conn[] = [];
    const holding = (async () => {
      for await (const c of mute) held.push(c);
    })();
    try {
      await unreachable(
        `https://127.0.0.1:${(mute.addr as Deno.NetAddr).port}`,
        () => {},
        /: no TLS handshake within 300 ms \(ETIMEDOUT\): check the address, firewalls and proxy-url or HTTPS_PROXY$/,
        300,
      );
    } finally {
      mute.close();
      await holding;
      for (const c of held) c.close();
    }
    const api = new URL(
      (parse(await Deno.readTextFile(env.kubeconfig)) as Kubeconfig).clusters[0].cluster.server as string,
    );
    await unreachable(
      api.origin,
      (c) => delete c["certificate-authority-data"],
      /TLS: the server's certificate for 127\.0\.0\.1 is not accepted: .* \(\S+\): set the cluster's certificate-authority/,
    );
    await unreachable(
      api.origin,
      (c) => c["tls-server-name"] = "api.example.com",
      /TLS: the server's certificate for api\.example\.com is not accepted: .*\(ERR_TLS_CERT_ALTNAME_INVALID\): use a server address the certificate names/,
    );
  } finally {
    await Deno.remove(home, { recursive: true });
    console.log(errors.join("\n"));
  }
});

Deno.test("client: a request on a half-dead connection fails at its deadline instead of hanging", async () => {
  const env = await testEnv();
  const proxy = await FaultInjector.forKubeconfig(env.kubeconfig);
  const client = await proxy.client(env.kubeconfig, { requestTimeoutMs: 1000 });
  try {
    await client.list(CONFIG_MAPS, "default");
    proxy.silence();
    const t0 = performance.now();
    await assert.rejects(client.list(CONFIG_MAPS, "default"), (e: Error) => e.name === "TimeoutError");
    const took = performance.now() - t0;
    assert.ok(took >= 900 && took < 3000, `failed after ${took.toFixed(0)} ms`);
    proxy.resume();
    await client.list(CONFIG_MAPS, "default");
  } finally {
    await proxy.close();
    client.close();
  }
});

Deno.test("client: watch() ends cleanly on abort (before headers, mid-stream), on break and on a throwing consumer", async () => {
  const env = await testEnv();
  const admin = await KubeClient.load(env.kubeconfig);
  const proxy = await FaultInjector.forKubeconfig(env.kubeconfig);
  const client = await proxy.client(env.kubeconfig);
  try {
    const ns = await freshNamespace(admin, "kcli");
    await admin.create(CONFIG_MAPS, { metadata: { name: "one", namespace: ns } });
    const query = { resourceVersion: "0", timeoutSeconds: 30 };

    // Mid-stream: the initial events arrive (ADDED, then the bookmark that ends them), then nothing until the abort.
    // The API server gzips such a stream, and Deno's fetch used to end a gzipped stream after its first chunk: the
    // stream ending by itself here (no AbortError) is that regression.
    const mid = new AbortController();
    const events: string[] = [];
    const midStream = (async () => {
      for await (const ev of client.watch<KubeObject>(CONFIG_MAPS, ns, query, mid.signal)) {
        events.push(ev.type);
        if (ev.type === "BOOKMARK") setTimeout(() => mid.abort(), 300);
      }
    })();
    await assert.rejects(midStream, (e: Error) => e.name === "AbortError");
    // the API server may send another bookmark before the abort lands (a loaded machine stretches the 300 ms)
    assert.deepEqual(events.slice(0, 2), ["ADDED", "BOOKMARK"]);
    assert.ok(events.slice(2).every((t) => t === "BOOKMARK"), events.join(" "));

    // Before headers: the link is silent, so the request is still waiting for its response when aborted.
    proxy.silence();
    const early = new AbortController();
    const beforeHeaders = (async () => {
      for await (const _ of client.watch<KubeObject>(CONFIG_MAPS, ns, query, early.signal)) {
        assert.fail("no event can pass a silent link");
      }
    })();
    setTimeout(() => early.abort(), 200);
    await assert.rejects(beforeHeaders, (e: Error) => e.name === "AbortError");
    proxy.resume();

    // The consumer stops on its own: break, then throw. The signal never aborts.
    const never = new AbortController();
    for await (const _ of client.watch<KubeObject>(CONFIG_MAPS, ns, query, never.signal)) break;
    await assert.rejects(
      (async () => {
        for await (const _ of client.watch<KubeObject>(CONFIG_MAPS, ns, query, never.signal)) {
          throw new Error("consumer failed");
        }
      })(),
      /consumer failed/,
    );
  } finally {
    await proxy.close();
    client.close();
    admin.close();
  }
});
