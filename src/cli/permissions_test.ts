import assert from "node:assert/strict";
import { commandPermissions, type Facts } from "./permissions.ts";
import { SERVICE_ACCOUNT_DIR } from "../kube/kubeconfig_needs.ts";

const CODE = "/app/qemu-ssh-provisioner.js";

function facts(env: Record<string, string> = {}, files: Record<string, string> = {}): Facts {
  return { env, home: "/home/u", readFile: (p) => files[p], code: CODE };
}

/** What the operator starts, in a k3s cluster: the API server is wherever the pod's environment says. */
const OPERATOR_ARGS = [
  "--provisioner=qemu-ssh.jumpstarter.dev",
  "--leader-elect",
  "--health-probe-bind-address=:8081",
  "--metrics-bind-address=0",
];

Deno.test("permissions: in a cluster, the API server from the pod, :8081, and the private lab ranges on port 22", () => {
  const p = commandPermissions(
    OPERATOR_ARGS,
    facts({ KUBERNETES_SERVICE_HOST: "10.43.0.1", KUBERNETES_SERVICE_PORT: "443" }, {
      "/home/u/.kube/config": "a kubeconfig in the image's home is not used in a pod",
    }),
  );
  assert.deepEqual(p, {
    env: [
      "KUBECONFIG",
      "HOME",
      "KUBERNETES_SERVICE_HOST",
      "KUBERNETES_SERVICE_PORT",
      "HTTPS_PROXY",
      "https_proxy",
      "HTTP_PROXY",
      "http_proxy",
      "NO_PROXY",
      "no_proxy",
      "NAMESPACE",
      "LAB_HOSTS",
      "LOG_TOKENS",
      "LOG_STREAM",
    ],
    ffi: false,
    import: false,
    net: ["10.43.0.1:443", "0.0.0.0:8081", "10.0.0.0/8:22", "172.16.0.0/12:22", "192.168.0.0/16:22"],
    read: [CODE, SERVICE_ACCOUNT_DIR],
    run: false,
    sys: ["hostname"],
    write: false,
  });
});

Deno.test("permissions: a proxy from the environment is granted like the kubeconfig's, unless NO_PROXY says", () => {
  const env = { KUBERNETES_SERVICE_HOST: "10.43.0.1", KUBERNETES_SERVICE_PORT: "443", HTTPS_PROXY: "proxy:3128" };
  const net = (e: Record<string, string>) => (commandPermissions(["run"], facts(e)).net as string[]).slice(0, 2);
  assert.deepEqual(net(env), ["10.43.0.1:443", "proxy:3128"]);
  assert.deepEqual(net({ ...env, NO_PROXY: "10.0.0.0/8" }), ["10.43.0.1:443", "0.0.0.0:8081"]);
});

Deno.test("permissions: --lab-hosts (or LAB_HOSTS) replaces the default; aliases and listeners follow the flags", () => {
  const env = { KUBERNETES_SERVICE_HOST: "fd00::1", KUBERNETES_SERVICE_PORT: "6443", LAB_HOSTS: "192.0.2.0/24:22" };
  assert.deepEqual(commandPermissions(["run"], facts(env)).net, ["[fd00::1]:6443", "0.0.0.0:8081", "192.0.2.0/24:22"]);
  const p = commandPermissions([
    "--lab-hosts",
    "lab-host-01.example.com:22",
    "--host-alias",
    "lab-host-01.example.com=10.76.0.2",
    "--health-probe-bind-address",
    "127.0.0.1:9440",
    "--metrics-bind-address=[::]:8080",
  ], facts(env));
  assert.deepEqual(p.net, [
    "[fd00::1]:6443",
    "127.0.0.1:9440",
    "[::]:8080",
    "lab-host-01.example.com:22",
    "10.76.0.2:22",
  ]);
  // a list that does not parse grants no lab host; the command reports it
  assert.deepEqual(commandPermissions(["run", "--lab-hosts=a:b"], facts(env)).net, ["[fd00::1]:6443", "0.0.0.0:8081"]);
});

Deno.test("permissions: outside a cluster, the kubeconfig's server, proxy, files and exec plugin", () => {
  const kubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://api.lab.example:6443", certificate-authority: ca.crt, proxy-url: "http://proxy.example:3128"}
users:
- name: u
  user: {exec: {apiVersion: client.authentication.k8s.io/v1, command: kubelogin}}
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`;
  const p = commandPermissions(
    ["run", "--kubeconfig=/etc/qsp/kubeconfig"],
    facts({}, { "/etc/qsp/kubeconfig": kubeconfig }),
  );
  assert.deepEqual(p.net, [
    "api.lab.example:6443",
    "proxy.example:3128",
    "0.0.0.0:8081",
    "10.0.0.0/8:22",
    "172.16.0.0/12:22",
    "192.168.0.0/16:22",
  ]);
  assert.deepEqual(p.read, [CODE, "/etc/qsp/kubeconfig", "/etc/qsp/ca.crt"]);
  assert.deepEqual(p.run, ["kubelogin"]);
  // $KUBECONFIG, then ~/.kube/config: the same file found another way
  assert.deepEqual(
    commandPermissions(
      ["run"],
      facts({ KUBECONFIG: "/etc/qsp/kubeconfig" }, {
        "/etc/qsp/kubeconfig": kubeconfig,
      }),
    ).net,
    p.net,
  );
  assert.deepEqual(
    commandPermissions(["run"], facts({}, { "/home/u/.kube/config": kubeconfig })).read,
    [CODE, "/home/u/.kube/config", "/home/u/.kube/ca.crt"],
  );
});

Deno.test("permissions: render reads the files it is given; crds and version nothing but the program", () => {
  const p = commandPermissions(["render", "-f", "a.yaml", "--class=b.yaml", "--set", "c.yaml", "-f", "-"], facts());
  assert.deepEqual(p.read, [CODE, "b.yaml", "c.yaml", "a.yaml"]);
  assert.equal(p.net, false);
  for (const argv of [["crds"], ["version"], ["--version"], ["help"]]) {
    const q = commandPermissions(argv, facts());
    assert.deepEqual([q.read, q.net, q.env, q.run, q.write], [[CODE], false, false, false, false], argv.join(" "));
  }
});

Deno.test("permissions: doctor reaches the one host it checks and reads its key and known_hosts", () => {
  const p = commandPermissions(
    ["doctor", "--host", "lab-host-01.example.com", "--address", "10.76.0.2", "--key", "/k/id", "--port", "2222"],
    facts(),
  );
  assert.deepEqual(p.net, ["10.76.0.2:2222"]);
  assert.deepEqual(p.read, [CODE, "/k/id", "/home/u/.ssh/known_hosts"]);
  assert.equal(p.write, false);
});
