/**
 * The manifests' RBAC against a real API server. The controller runs in this process as the manifests'
 * ServiceAccount (with a token the API server issued for it) with nothing but the Role bound to it, and must do its
 * whole job: elect itself, deploy the seed's set on a lab host, make it Available, tear it down when the set is
 * deleted. Once with manifests/role.yaml, once with the Role the Jumpstarter operator creates. Every request is
 * recorded, so the test also shows that each of our grants is used and that the Role is no wider than the operator's.
 */
import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import { freshNamespace, seedExample, testEnv, waitFor } from "./env.ts";
import { DEFAULT_LAB_HOSTS } from "../src/host/lab_hosts.ts";
import { startFakeJumpstarter } from "./fake_jumpstarter.ts";
import { hostExec, type LabHost } from "./labhost/labhost.ts";
import { KubeClient, type Resource, resourcePath } from "../src/kube/client.ts";
import {
  EVENTS,
  EXPORTER_SETS,
  EXPORTERS,
  NAMESPACES,
  SECRETS,
  VIRTUAL_TARGET_CLASSES,
} from "../src/kube/resources.ts";
import { readClusterId } from "../src/run.ts";
import type { Exporter, ExporterSet, KubeObject, Secret } from "../src/api/types.ts";
import { SshPool } from "../src/host/ssh.ts";
import { LabHosts } from "../src/host/lab.ts";
import { Controller } from "../src/provision/controller.ts";
import { pinHostKey } from "../src/provision/host_keys.ts";
import type { LabTarget } from "../src/provision/credentials.ts";
import { acquireLeadership } from "../src/kube/leader.ts";
import { createLogger } from "../src/observe/log.ts";
import { PINNED_HOST_KEYS_KEY } from "../src/provision/credentials.ts";
import {
  DEPLOYMENTS,
  inNamespace,
  installClusterIdRole,
  installControllerRbac,
  manifest,
  MANIFESTS,
  type PolicyRule,
  ROLE_BINDINGS,
  ROLES,
  SERVICE_ACCOUNTS,
} from "./rbac.ts";

const SEED_HOST = "lab-host-01.example.com";
const SET = "aarch64-ssh-pool";
const PROVISIONER = "qemu-ssh.jumpstarter.dev";

/**
 * The Role the Jumpstarter operator gives every exporter-set provisioner (exporterSetPolicyRules in
 * controller/deploy/operator/internal/controller/jumpstarter/exporterset.go): what we must fit into.
 */
const OPERATOR_RULES: PolicyRule[] = [
  { apiGroups: ["virtualtarget.jumpstarter.dev"], resources: ["exportersets"], verbs: ["get", "list", "watch"] },
  {
    apiGroups: ["virtualtarget.jumpstarter.dev"],
    resources: ["exportersets/status", "exportersets/scale"],
    verbs: ["get", "update", "patch"],
  },
  { apiGroups: ["virtualtarget.jumpstarter.dev"], resources: ["exportersets/finalizers"], verbs: ["update"] },
  {
    apiGroups: ["virtualtarget.jumpstarter.dev"],
    resources: ["virtualtargetclasses"],
    verbs: ["get", "list", "watch"],
  },
  {
    apiGroups: ["jumpstarter.dev"],
    resources: ["exporters"],
    verbs: ["get", "list", "watch", "create", "update", "patch", "delete"],
  },
  { apiGroups: ["jumpstarter.dev"], resources: ["leases"], verbs: ["get", "list", "watch"] },
  {
    apiGroups: ["networking.k8s.io"],
    resources: ["networkpolicies"],
    verbs: ["get", "list", "watch", "create", "update", "patch"],
  },
  { apiGroups: [""], resources: ["pods"], verbs: ["get", "list", "watch", "create", "update", "patch", "delete"] },
  { apiGroups: [""], resources: ["events"], verbs: ["create", "patch"] },
  { apiGroups: [""], resources: ["secrets"], verbs: ["get", "list", "watch", "create", "update", "patch"] },
  { apiGroups: [""], resources: ["configmaps"], verbs: ["get", "list", "watch"] },
  {
    apiGroups: ["coordination.k8s.io"],
    resources: ["leases"],
    verbs: ["get", "list", "watch", "create", "update", "patch", "delete"],
  },
];

/**
 * Grants of our Role that a run against this API server cannot exercise, and why they are still needed. Any other
 * grant the run does not use is a grant too many.
 */
const NOT_EXERCISED: Record<string, string> = {
  "virtualtarget.jumpstarter.dev exportersets/finalizers update *":
    "checked inside the API server by the OwnerReferencesPermissionEnforcement admission plugin (on here, as on " +
    "OpenShift) when Exporters are created with blockOwnerDeletion: no request of ours names it",
  " events patch *": "bumps the count of an event repeated within 10 minutes",
  "virtualtarget.jumpstarter.dev exportersets get *":
    "confirms that a set missing from the cache is gone before its Exporters are deleted; the run scales down to " +
    "none before deleting its set, so there is nothing to delete",
  "jumpstarter.dev exporters get *":
    "ExitAndReplace reads an Exporter afresh before deleting it once its lease ended; the run ends no lease " +
    "(e2e_real_jumpstarter_test.ts and the sandbox demo do, as the manifests' ServiceAccount in the demo)",
};

// ---------------------------------------------------------------- rules as sets of single grants

/** "group resource verb name" for every combination a rule allows; `*` stands for any name. */
function grants(rules: PolicyRule[]): Set<string> {
  const out = new Set<string>();
  for (const r of rules) {
    for (const g of r.apiGroups) {
      for (const res of r.resources) {
        for (const v of r.verbs) {
          for (const n of r.resourceNames?.length ? r.resourceNames : ["*"]) {
            out.add(`${g} ${res} ${v} ${n}`);
          }
        }
      }
    }
  }
  return out;
}

/** Whether `rules` allow one grant, with RBAC's matching: `*` wildcards, and no resourceNames meaning any name. */
function allows(rules: PolicyRule[], grant: string): boolean {
  const [group, resource, verb, name] = grant.split(" ");
  const has = (list: string[] | undefined, v: string) => list?.includes("*") || list?.includes(v);
  return rules.some((r) =>
    has(r.apiGroups, group) && has(r.resources, resource) && has(r.verbs, verb) &&
    (!r.resourceNames?.length || (name !== "*" && r.resourceNames.includes(name)))
  );
}

/** Whether grant `g` (maybe for any name) is the one request grant `u` needed. */
const covers = (g: string, u: string) => {
  const [gg, gr, gv, gn] = g.split(" ");
  const [ug, ur, uv, un] = u.split(" ");
  return gg === ug && gr === ur && gv === uv && (gn === "*" || gn === un);
};

const ourRules = async () => (await manifest<{ rules: PolicyRule[] }>("role.yaml")).rules;

// ---------------------------------------------------------------- pure checks

Deno.test("rbac: our Role grants nothing the operator's Role does not", async () => {
  const ours = await ourRules();
  const beyond = [...grants(ours)].filter((g) => !allows(OPERATOR_RULES, g));
  assert.deepEqual(beyond, [], `grants beyond the operator's Role: ${beyond.join("; ")}`);
  for (const r of ours) {
    for (const field of [r.apiGroups, r.resources, r.verbs]) assert.ok(!field.includes("*"), "no wildcards");
  }
  // The comparison itself must be able to fail.
  assert.ok(!allows(OPERATOR_RULES, "apps deployments create *"));
  assert.ok(!allows(OPERATOR_RULES, " secrets delete *"));
  assert.ok(allows(OPERATOR_RULES, " secrets get qemu-ssh-known-hosts"));
});

Deno.test("manifests: the Deployment, ServiceAccount and RBAC are what the Jumpstarter operator creates", async () => {
  const labels = {
    component: "exporterset-controller",
    provisioner: "qemu-ssh-jumpstarter-dev",
    controller: "jumpstarter",
  };
  const base = "jumpstarter-exporterset-qemu-ssh-jumpstarter-dev";
  // deno-lint-ignore no-explicit-any
  const d = await manifest<any>("deployment.yaml");
  assert.equal(d.metadata.name, base);
  assert.deepEqual(d.metadata.labels, labels);
  assert.deepEqual(d.spec.selector.matchLabels, labels);
  assert.deepEqual(d.spec.template.metadata.labels, labels);
  const pod = d.spec.template.spec;
  assert.equal(pod.serviceAccountName, base);
  assert.equal(pod.terminationGracePeriodSeconds, 30);
  assert.deepEqual(pod.securityContext, { runAsNonRoot: true, seccompProfile: { type: "RuntimeDefault" } });
  assert.equal(pod.containers.length, 1);
  const c = pod.containers[0];
  assert.equal(c.name, "manager");
  assert.deepEqual(c.command, ["/exporter-set-controller"]);
  assert.deepEqual(c.args, [
    `--provisioner=${PROVISIONER}`,
    "--leader-elect",
    "--health-probe-bind-address=:8081",
    "--metrics-bind-address=0",
  ]);
  // the operator's env, plus LAB_HOSTS with its default value, to be edited (unset under the operator: same default)
  assert.deepEqual(c.env, [
    { name: "NAMESPACE", valueFrom: { fieldRef: { fieldPath: "metadata.namespace" } } },
    { name: "LAB_HOSTS", value: DEFAULT_LAB_HOSTS },
  ]);
  assert.deepEqual(c.ports, [{ name: "health", containerPort: 8081, protocol: "TCP" }]);
  assert.deepEqual(c.livenessProbe, {
    httpGet: { path: "/healthz", port: 8081 },
    initialDelaySeconds: 15,
    periodSeconds: 20,
    timeoutSeconds: 1,
  });
  assert.deepEqual(c.readinessProbe, {
    httpGet: { path: "/readyz", port: 8081 },
    initialDelaySeconds: 5,
    periodSeconds: 10,
    timeoutSeconds: 1,
  });
  assert.deepEqual(c.resources, {
    requests: { cpu: "100m", memory: "256Mi" },
    limits: { cpu: "500m", memory: "512Mi" },
  });
  assert.deepEqual(c.securityContext, {
    allowPrivilegeEscalation: false,
    readOnlyRootFilesystem: true,
    capabilities: { drop: ["ALL"] },
  });

  const sa = await manifest("serviceaccount.yaml");
  const role = await manifest("role.yaml");
  // deno-lint-ignore no-explicit-any
  const rb = await manifest<any>("rolebinding.yaml");
  assert.equal(sa.metadata.name, base);
  assert.equal(role.metadata.name, `${base}-role`);
  assert.equal(rb.metadata.name, `${base}-rolebinding`);
  assert.deepEqual(rb.roleRef, { apiGroup: "rbac.authorization.k8s.io", kind: "Role", name: `${base}-role` });
  assert.deepEqual(rb.subjects, [{ kind: "ServiceAccount", name: base, namespace: "jumpstarter" }]);
  for (const o of [sa, role, rb, d]) assert.equal(o.metadata.namespace, "jumpstarter");

  const k = await manifest<{ resources: string[] }>("kustomization.yaml");
  const files: string[] = [];
  for await (const e of Deno.readDir(MANIFESTS)) {
    if (e.isFile && e.name.endsWith(".yaml") && e.name !== "kustomization.yaml") files.push(e.name);
  }
  assert.deepEqual(k.resources.filter((r) => r.endsWith(".yaml")).sort(), files.sort(), "kustomization lists all");
  // `kubectl delete -k manifests` must not take Jumpstarter's namespace or the users' ExporterSets (CRDs) with it
  assert.ok(!k.resources.some((r) => r.includes("crds")), "CRDs are installed on their own");
  assert.ok(!files.includes("namespace.yaml"), "the namespace is Jumpstarter's");
});

// ---------------------------------------------------------------- against the API server

Deno.test({
  name: "manifests: the API server accepts every namespaced manifest (server-side dry run)",
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const env = await testEnv();
    const admin = await KubeClient.load(env.kubeconfig);
    try {
      const ns = await freshNamespace(admin, "rbac-dry");
      const kinds: [string, Resource][] = [
        ["serviceaccount.yaml", SERVICE_ACCOUNTS],
        ["role.yaml", ROLES],
        ["rolebinding.yaml", ROLE_BINDINGS],
        ["deployment.yaml", DEPLOYMENTS],
      ];
      for (const [file, r] of kinds) {
        await admin.request("POST", resourcePath(r, { namespace: ns }), {
          body: await inNamespace(file, ns),
          query: { dryRun: "All", fieldValidation: "Strict" },
        });
      }
    } finally {
      admin.close();
    }
  },
});

/** The RBAC grant ("group resource verb name") one request needs, named as in `grants`. */
function grantOf(method: string, path: string, query: Record<string, unknown> = {}): string {
  const m = /^\/(?:api\/v1|apis\/([^/]+)\/[^/]+)(?:\/namespaces\/[^/]+)?\/([^/]+)(?:\/([^/]+))?(?:\/([^/]+))?$/.exec(
    path,
  );
  if (!m) throw new Error(`not a resource path: ${path}`);
  const [, group = "", plural, name, sub] = m;
  const resource = sub ? `${plural}/${sub}` : plural;
  const verb = method === "GET"
    ? (query.watch ? "watch" : name ? "get" : "list")
    : ({ POST: "create", PUT: "update", PATCH: "patch", DELETE: name ? "delete" : "deletecollection" } as const)[
      method as "POST"
    ];
  return `${group} ${resource} ${verb} ${name && method !== "POST" ? name : "*"}`;
}

const isRefusal = (line: string) => /forbidden|\b403\b/i.test(line);

interface Run {
  used: Set<string>;
  paths: Set<string>;
  logs: string[];
  seconds: number;
}

/** The whole job of the seed's ExporterSet, with the controller acting as the ServiceAccount bound to `rules`. */
/** `manifests`: the pin Secret is there as manifests/known-hosts-secret.yaml ships it (else the controller creates it). */
async function wholeJobAs(rules: PolicyRule[], prefix: string, host: LabHost, manifests: boolean): Promise<Run> {
  const t0 = performance.now();
  const env = await testEnv();
  const admin = await KubeClient.load(env.kubeconfig);
  const dir = await Deno.makeTempDir({ prefix: "qsp-rbac-" });
  const ns = await freshNamespace(admin, prefix);
  const kubeconfig = await installControllerRbac(admin, env.kubeconfig, ns, dir, rules, manifests);
  const used = new Set<string>();
  const paths = new Set<string>();
  const client = await KubeClient.load(kubeconfig, {
    onRequest: (method, path, query) => {
      used.add(grantOf(method, path, query));
      paths.add(path);
    },
  });

  const logs: string[] = [];
  const log = createLogger({ level: "info", write: (l) => logs.push(l) });
  const fake = startFakeJumpstarter(admin, ns);
  const pool = new SshPool({ onHostKeyAccepted: (t, line) => pinHostKey(client, t as LabTarget, line) });
  const shutdown = new AbortController();
  let controller: Controller | undefined;
  let leadership: Awaited<ReturnType<typeof acquireLeadership>> = undefined;
  try {
    // The binding reaches the authorizer's cache a moment after it is written.
    await waitFor(() => client.list(EXPORTER_SETS, ns).then(() => true), { what: "the Role to take effect" });
    leadership = await acquireLeadership(client, {
      namespace: ns,
      name: `exporterset-${PROVISIONER.replaceAll(".", "-")}`,
      identity: `rbac-test-${ns}`,
      log,
    }, shutdown.signal);
    assert.ok(leadership, "leader election");
    controller = new Controller({
      client,
      hosts: new LabHosts(pool, { hostAliases: { [SEED_HOST]: host.address } }),
      log,
      provisioner: PROVISIONER,
      namespace: ns,
      resyncMs: 60_000,
      sweepMs: 3_600_000,
      // the Role alone cannot read kube-system (manifests/clusterrole.yaml can: see the test below)
      clusterId: `rbac-test-${ns}`,
    });
    await controller.start();

    // What a user does (steps 2 to 4 of the feature description), with the admin's rights.
    const key = await Deno.readTextFile(host.privateKeyPath);
    await admin.create<Secret>(SECRETS, {
      metadata: { name: "lab-ssh-key", namespace: ns },
      type: "Opaque",
      data: { "ssh-privatekey": Buffer.from(key).toString("base64") },
    });
    await admin.create(VIRTUAL_TARGET_CLASSES, await seedExample("virtualtargetclass.yaml", ns));
    await admin.create(EXPORTER_SETS, await seedExample("exporterset.yaml", ns));

    await waitFor(async () => {
      const s = await admin.get<ExporterSet>(EXPORTER_SETS, ns, SET);
      const available = s.status?.conditions?.find((c) => c.type === "Available");
      return available?.status === "True" && s.status?.readyReplicas === 1;
    }, { what: "the set Available with 1 ready exporter", timeoutMs: 90_000 });
    const [e] = (await admin.list<Exporter>(EXPORTERS, ns)).items;
    const name = e.metadata.name!;
    const units = await hostExec(host, `systemctl is-active ${name}-runtime.service ${name}-exporter.service`);
    assert.equal(units.stdout, "active\nactive\n", "both units run on the lab host");
    const pins = await admin.find<Secret>(SECRETS, ns, "qemu-ssh-known-hosts");
    assert.ok(pins?.data?.[PINNED_HOST_KEYS_KEY], "the host key was pinned");
    const events = (await admin.list<KubeObject & { reason: string }>(EVENTS, ns)).items;
    assert.ok(events.some((ev) => ev.reason === "CreatedExporters"), "events were recorded");

    // Scale-down: the controller drains the exporter and deletes it itself, then tears the instance down.
    await admin.mergePatch(EXPORTER_SETS, ns, SET, { spec: { minAvailableReplicas: 0, scaleDownCooldown: "0s" } });
    await waitFor(async () => (await admin.list(EXPORTERS, ns)).items.length === 0, {
      what: "the exporters torn down and deleted",
      timeoutMs: 60_000,
    });
    await admin.delete(EXPORTER_SETS, ns, SET);
    const left = await hostExec(
      host,
      `ls /etc/containers/systemd/ /etc/jumpstarter/exporters/ | grep -c ${name} || true`,
    );
    assert.equal(left.stdout.trim(), "0", "nothing left on the lab host");
    // Leader election renews every 2 s; make sure the run saw a renewal (an update), not only the first create.
    await waitFor(() => used.has(`coordination.k8s.io leases update exporterset-qemu-ssh-jumpstarter-dev`), {
      what: "a Lease renewal",
      timeoutMs: 10_000,
    });
  } catch (e) {
    const refused = logs.filter(isRefusal);
    if (refused.length) {
      throw new Error(`${e instanceof Error ? e.message : e}\nrefused:\n${refused.slice(0, 5).join("\n")}`);
    }
    throw e;
  } finally {
    shutdown.abort();
    await controller?.stop();
    await leadership?.release().catch(() => {});
    await fake.stop();
    await pool.close();
    client.close();
    admin.close();
    await Deno.remove(dir, { recursive: true });
  }
  assert.deepEqual(logs.filter(isRefusal), [], "no request was refused");
  for (const p of paths) assert.ok(p.includes(`/namespaces/${ns}/`), `namespaced request: ${p}`);
  return { used, paths, logs, seconds: (performance.now() - t0) / 1000 };
}

Deno.test({
  name: "rbac: the controller does its whole job as the ServiceAccount with manifests/role.yaml, using every grant",
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const env = await testEnv();
    const ours = await ourRules();
    const run = await wholeJobAs(ours, "rbac-ours", env.labhosts[0], true);
    console.log(`  whole job in ${run.seconds.toFixed(1)}s`);
    for (const g of run.used) assert.ok(allows(ours, g), `used but not granted: ${g}`);
    const unused = [...grants(ours)].filter((g) => !(g in NOT_EXERCISED) && ![...run.used].some((u) => covers(g, u)));
    assert.deepEqual(unused, [], `granted but never used: ${unused.join("; ")}`);
  },
});

Deno.test({
  name: "rbac: the controller does its whole job as the ServiceAccount with the Jumpstarter operator's Role",
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const env = await testEnv();
    const run = await wholeJobAs(OPERATOR_RULES, "rbac-operator", env.labhosts[1] ?? env.labhosts[0], false);
    console.log(`  whole job in ${run.seconds.toFixed(1)}s`);
  },
});

Deno.test({
  name: "rbac: the cluster id needs manifests/clusterrole.yaml; without it the start fails naming that fix",
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const env = await testEnv();
    const admin = await KubeClient.load(env.kubeconfig);
    const dir = await Deno.makeTempDir({ prefix: "qsp-rbac-id-" });
    const ns = await freshNamespace(admin, "rbac-id");
    const sa = await KubeClient.load(await installControllerRbac(admin, env.kubeconfig, ns, dir));
    await waitFor(() => sa.list(EXPORTER_SETS, ns).then(() => true), { what: "the Role to take effect" });
    await assert.rejects(
      readClusterId(sa, undefined),
      /forbidden to read namespace kube-system.*manifests\/clusterrole\.yaml.*--cluster-id/,
    );
    const removeRole = await installClusterIdRole(admin, ns);
    try {
      const uid = (await admin.get<KubeObject>(NAMESPACES, undefined, "kube-system")).metadata.uid;
      const read = await waitFor(() => readClusterId(sa, undefined).catch(() => undefined), {
        what: "the ClusterRole to take effect",
      });
      assert.equal(read, uid);
    } finally {
      await removeRole();
      sa.close();
      admin.close();
    }
  },
});
