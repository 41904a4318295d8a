/**
 * manifests/prometheus: the alert rules pass promtool and each alert fires on the series of
 * test/prometheus/alerts_test.yaml; every metric the dashboard and the rules query is one the real controller's
 * /metrics exports; the Service reaches the health port of the Deployment's Pods.
 */
import assert from "node:assert/strict";
import { parse, parseAllDocuments, stringify } from "yaml";
import { builtPath } from "./built.ts";
import { freshNamespace, testEnv } from "./env.ts";
import { KubeClient } from "../src/kube/client.ts";
import { ControllerProcess } from "../bench/controller.ts";

const DIR = new URL("../manifests/prometheus/", import.meta.url);
const PROMTOOL = new URL("prometheus/promtool.sh", import.meta.url).pathname;
// deno-lint-ignore no-explicit-any
const yamlAt = async (name: string): Promise<any> => parse(await Deno.readTextFile(new URL(name, DIR)));

/** Every expression an alert rule or a dashboard panel evaluates. */
async function expressions(): Promise<string[]> {
  const rule = await yamlAt("prometheusrule.yaml");
  const dashboard = JSON.parse(await Deno.readTextFile(new URL("dashboard.json", DIR)));
  return [
    // deno-lint-ignore no-explicit-any
    ...rule.spec.groups.flatMap((g: any) => g.rules.map((r: any) => r.expr as string)),
    // deno-lint-ignore no-explicit-any
    ...dashboard.panels.flatMap((p: any) => p.targets.map((t: any) => t.expr as string)),
  ];
}

// The controller's metric families; anything else in an expression is PromQL (functions, labels, keywords).
const METRIC_RE = /\b(?:qemu_ssh|controller_runtime|rest_client|workqueue|leader_election)_[a-z_]+\b/g;

Deno.test("prometheus: promtool checks the rules, and each alert fires on its test series", async () => {
  const promtool = await builtPath(PROMTOOL);
  const dir = await Deno.makeTempDir({ prefix: "qsp-promtool-" });
  try {
    await Deno.writeTextFile(`${dir}/rules.yaml`, stringify((await yamlAt("prometheusrule.yaml")).spec));
    await Deno.copyFile(new URL("prometheus/alerts_test.yaml", import.meta.url), `${dir}/alerts_test.yaml`);
    for (const args of [["check", "rules", "rules.yaml"], ["test", "rules", "alerts_test.yaml"]]) {
      const out = await new Deno.Command(promtool, { args, cwd: dir, stdout: "piped", stderr: "piped" }).output();
      const text = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
      assert.equal(out.code, 0, `promtool ${args.join(" ")}:\n${text}`);
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("prometheus: every metric the rules and the dashboard query is one the controller's /metrics exports", async () => {
  const env = await testEnv();
  const client = await KubeClient.load(env.kubeconfig);
  const ns = await freshNamespace(client, "prom");
  client.close();
  const logPath = await Deno.makeTempFile({ prefix: "qsp-prom-controller-", suffix: ".log" });
  const controller = await ControllerProcess.start({ kubeconfig: env.kubeconfig, namespace: ns, logPath });
  let text: string;
  try {
    text = await controller.metricsText();
  } finally {
    await controller.stop();
  }
  const families = new Map(
    [...text.matchAll(/^# TYPE (\S+) (\S+)$/gm)].map(([, name, type]) => [name, type]),
  );
  const exported = (name: string) => {
    if (families.has(name)) return true;
    const m = /^(.*)_(bucket|count|sum)$/.exec(name);
    return m !== null && families.get(m[1]) === "histogram";
  };
  for (const expr of await expressions()) {
    const names = expr.match(METRIC_RE) ?? [];
    assert.ok(names.length > 0, `no metric of the controller in ${expr}`);
    for (const n of names) assert.ok(exported(n), `${n} (in ${expr}) is not in /metrics: ${[...families.keys()]}`);
  }
  await Deno.remove(logPath);
});

Deno.test("prometheus: the Service selects the Deployment's Pods and targets the port that serves /metrics", async () => {
  const service = await yamlAt("service.yaml");
  const monitor = await yamlAt("servicemonitor.yaml");
  const [deployment] = parseAllDocuments(await Deno.readTextFile(new URL("../deployment.yaml", DIR))).map((d) =>
    // deno-lint-ignore no-explicit-any
    d.toJS() as any
  );
  const pod = deployment.spec.template;
  assert.deepEqual(service.spec.selector, deployment.spec.selector.matchLabels);
  for (const [k, v] of Object.entries(service.spec.selector)) assert.equal(pod.metadata.labels[k], v);
  const [container] = pod.spec.containers;
  const port = container.ports.find((p: { name: string }) => p.name === service.spec.ports[0].targetPort);
  assert.ok(port, `no container port named ${service.spec.ports[0].targetPort}`);
  assert.ok(
    container.args.includes(`--health-probe-bind-address=:${port.containerPort}`),
    "the target port is the health listener, which serves /metrics",
  );
  for (const [k, v] of Object.entries(monitor.spec.selector.matchLabels)) assert.equal(service.metadata.labels[k], v);
  assert.equal(monitor.spec.endpoints[0].port, service.spec.ports[0].name);
  // the rules' job selector is the Service's name, which is the job Prometheus Operator gives its targets
  const rules = JSON.stringify((await yamlAt("prometheusrule.yaml")).spec);
  for (const [, job] of rules.matchAll(/job=\\"([^"\\]+)\\"/g)) assert.equal(job, service.metadata.name);
});
