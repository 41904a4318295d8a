import assert from "node:assert/strict";
import { Metrics } from "./metrics.ts";

Deno.test("metrics: Prometheus text format with labels, histograms and scrape-time values", () => {
  const m = new Metrics();
  m.reconcileTotal.inc({ controller: "exporterset", result: "success" });
  m.reconcileTotal.inc({ controller: "exporterset", result: "success" });
  m.deploySeconds.observe({ host: "lab-host-01" }, 0.3);
  m.gauge("workqueue_depth", "Keys waiting.", () => [[{ name: "exporterset" }, 3]]);
  m.gauge("rest_client_requests_total", "Requests.", () => [[{}, 42]], "counter");
  const text = m.render();
  assert.match(text, /^controller_runtime_reconcile_total\{controller="exporterset",result="success"\} 2$/m);
  assert.match(text, /^qemu_ssh_deploy_seconds_bucket\{host="lab-host-01",le="0.25"\} 0$/m);
  assert.match(text, /^qemu_ssh_deploy_seconds_bucket\{host="lab-host-01",le="0.5"\} 1$/m);
  assert.match(text, /^qemu_ssh_deploy_seconds_count\{host="lab-host-01"\} 1$/m);
  assert.match(text, /^workqueue_depth\{name="exporterset"\} 3$/m);
  assert.match(text, /^# TYPE rest_client_requests_total counter\nrest_client_requests_total 42$/m);
});
