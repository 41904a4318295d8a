import assert from "node:assert/strict";
import {
  hostPort,
  KubeconfigError,
  kubeconfigNeeds,
  proxyFromEnvironment,
  resolveKubeconfig,
  resolvePath,
} from "./kubeconfig_needs.ts";

const config = (cluster: string, user: string, current = "dev") => `
apiVersion: v1
kind: Config
current-context: ${current}
clusters:
- name: c1
  cluster:
${cluster.replace(/^/gm, "    ")}
users:
- name: u1
  user:
${user.replace(/^/gm, "    ")}
contexts:
- name: dev
  context: { cluster: c1, user: u1, namespace: team }
- name: other
  context: { cluster: c1, user: u1 }
`;

Deno.test("kubeconfigNeeds: server host:port, proxy, files resolved against the kubeconfig's directory, exec", () => {
  const text = config(
    "server: https://api.example.com:6443/\ncertificate-authority: ca.crt\nproxy-url: http://proxy.corp:3128",
    "client-certificate: ../pki/me.crt\nclient-key: /abs/me.key\ntokenFile: tok\n" +
      "exec: { apiVersion: client.authentication.k8s.io/v1, command: ./bin/login }",
  );
  assert.deepEqual(kubeconfigNeeds(text, "/home/u/.kube/config"), {
    server: "api.example.com:6443",
    proxy: "proxy.corp:3128",
    files: ["/home/u/.kube/ca.crt", "/home/u/pki/me.crt", "/abs/me.key", "/home/u/.kube/tok"],
    exec: "/home/u/.kube/bin/login",
  });
});

Deno.test("kubeconfigNeeds: default ports, IPv6, scheme-less servers, inline data needs no files, bare exec names", () => {
  const ca = btoa("-----BEGIN CERTIFICATE-----\n");
  const needs = (server: string, extra = "") =>
    kubeconfigNeeds(config(`server: ${server}\ncertificate-authority-data: ${ca}${extra}`, "token: abc"), "/k/config");
  assert.deepEqual(needs("https://10.0.0.1"), { server: "10.0.0.1:443", files: [] });
  assert.deepEqual(needs("http://10.0.0.1"), { server: "10.0.0.1:80", files: [] });
  assert.deepEqual(needs("https://[fd00::1]:6443"), { server: "[fd00::1]:6443", files: [] });
  assert.deepEqual(needs("https://[fd00::1]"), { server: "[fd00::1]:443", files: [] });
  assert.deepEqual(needs("api.local:6443"), { server: "api.local:6443", files: [] });
  assert.deepEqual(needs("https://a:1", "\nproxy-url: socks5://s"), { server: "a:1", proxy: "s:1080", files: [] });
  // data wins over a file of the same thing, and an inline token over a tokenFile
  assert.deepEqual(needs("https://a:1", "\ncertificate-authority: ca.crt"), { server: "a:1", files: [] });
  const withExec = config("server: https://a:1", "exec: { apiVersion: v1, command: kubelogin }");
  assert.equal(kubeconfigNeeds(withExec, "/k/config").exec, "kubelogin");
  assert.deepEqual(
    kubeconfigNeeds(config("server: https://a:1", "token: t\ntokenFile: f"), "/k/config").files,
    [],
  );
});

Deno.test("resolveKubeconfig: context choice, fields, and one-line errors naming the file and context", () => {
  const text = config(
    "server: https://a:1\ninsecure-skip-tls-verify: true\ntls-server-name: api.internal",
    "token: t\nas: alice\nas-groups: [g1, g2]",
  );
  const c = resolveKubeconfig([{ text, path: "/k/config" }]);
  assert.equal(c.context, "dev");
  assert.equal(c.namespace, "team");
  assert.equal(c.insecureSkipTlsVerify, true);
  assert.equal(c.tlsServerName, "api.internal");
  assert.deepEqual(c.impersonate, { user: "alice", uid: undefined, groups: ["g1", "g2"] });
  assert.equal(resolveKubeconfig([{ text, path: "/k/config" }], "other").context, "other");

  const fails = (t: string, re: RegExp, context?: string) =>
    assert.throws(() => resolveKubeconfig([{ text: t, path: "/k/config" }], context), (e: Error) => {
      assert.ok(e instanceof KubeconfigError);
      assert.match(e.message, re);
      assert.ok(!e.message.includes("\n"));
      return true;
    });
  fails(text, /^kubeconfig \/k\/config: context "nope" \(contexts: dev, other\) does not exist: run/, "nope");
  fails(config("server: https://a:1", "token: t", "gone"), /context "gone" \(current-context of \/k\/config, contexts/);
  fails(config("server: https://a:1", "token: t", '""'), /^kubeconfig \/k\/config has no current-context \(contexts/);
  fails(config("insecure-skip-tls-verify: true", "token: t"), /cluster "c1" \(context "dev"\) has no server$/);
  fails(config("server: https://a:1\nproxy-url: ftp://p", "token: t"), /proxy-url ftp:\/\/p: use an http/);
  fails(config("server: https://a:1", "client-certificate: x.crt"), /has a client certificate but no client-key/);
  fails(config("server: https://a:1", "auth-provider: { name: oidc }"), /auth-provider "oidc".*use an exec/);
  fails(
    config("server: https://a:1", "exec: { command: x }"),
    /exec plugin of user "u1" \(context "dev"\) has no apiVersion/,
  );
  fails("clusters: [", /^kubeconfig \/k\/config is not valid YAML/);
  fails("", /has no current-context \(it defines no contexts\)/);
});

Deno.test("resolveKubeconfig: a $KUBECONFIG list merges, first name and first current-context win", () => {
  const a = { path: "/a/config", text: config("server: https://first:1\ncertificate-authority: ca", "token: a") };
  const b = {
    path: "/b/config",
    text: "current-context: x\nclusters: [{name: c2, cluster: {server: 'https://b:2'}}]\n" +
      "contexts: [{name: x, context: {cluster: c2}}, {name: dev, context: {cluster: c2}}]",
  };
  const c = resolveKubeconfig([a, b]);
  assert.equal(c.server, "https://first:1");
  assert.equal(c.caFile, "/a/ca");
  const other = resolveKubeconfig([b, a]);
  assert.equal(other.context, "x");
  assert.equal(other.server, "https://b:2");
  assert.equal(other.path, "/b/config");
});

Deno.test("resolvePath and hostPort", () => {
  assert.equal(resolvePath("ca.crt", "/home/u/.kube/config"), "/home/u/.kube/ca.crt");
  assert.equal(resolvePath("../../x", "/home/u/.kube/config"), "/home/x");
  assert.equal(resolvePath("/etc/ca", "/home/u/.kube/config"), "/etc/ca");
  assert.equal(resolvePath("a/./b", "config"), "a/b");
  assert.equal(hostPort("https://[::1]:6443/"), "[::1]:6443");
  assert.equal(hostPort("http://proxy"), "proxy:80");
});

Deno.test("proxyFromEnvironment: HTTPS_PROXY / HTTP_PROXY, NO_PROXY names, suffixes, CIDRs and ports; never loopback", () => {
  const env = (vars: Record<string, string>) => (n: string) => vars[n];
  const p = { HTTPS_PROXY: "proxy:3128" };
  assert.equal(proxyFromEnvironment("https://api.corp:6443", env(p)), "http://proxy:3128");
  assert.equal(proxyFromEnvironment("http://api.corp:8080", env(p)), undefined);
  assert.equal(proxyFromEnvironment("https://127.0.0.1:6443", env(p)), undefined);
  assert.equal(proxyFromEnvironment("https://api.corp", env({ https_proxy: "http://p:1" })), "http://p:1");
  for (const no of ["api.corp", ".corp", "corp", "*", "10.0.0.0/8", "api.corp:6443", " x , corp "]) {
    const host = no.includes("/") ? "https://10.1.2.3:6443" : "https://api.corp:6443";
    assert.equal(proxyFromEnvironment(host, env({ ...p, NO_PROXY: no })), undefined, no);
  }
  for (const no of ["other.corp", "pi.corp", "10.0.0.0/16", "api.corp:443", "[fd00::]/8"]) {
    const host = no.startsWith("10.") ? "https://10.1.2.3:6443" : "https://api.corp:6443";
    assert.equal(proxyFromEnvironment(host, env({ ...p, no_proxy: no })), "http://proxy:3128", no);
  }
  assert.equal(proxyFromEnvironment("https://[fd00::5]:6443", env({ ...p, NO_PROXY: "fd00::/16" })), undefined);
});
