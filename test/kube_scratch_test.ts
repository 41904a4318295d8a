import { freshNamespace, testEnv } from "./env.ts";
import { FaultInjector } from "./faultproxy.ts";
import { KubeClient } from "../src/kube/client.ts";
import { CONFIG_MAPS } from "../src/kube/resources.ts";
import type { KubeObject } from "../src/api/types.ts";
Deno.test("scratch", async () => {
  const env = await testEnv();
  const admin = await KubeClient.load(env.kubeconfig);
  const proxy = await FaultInjector.forKubeconfig(env.kubeconfig);
  for (const client of [admin, await proxy.client(env.kubeconfig)]) {
    const ns = await freshNamespace(admin, "kcli");
    await admin.create(CONFIG_MAPS, { metadata: { name: "one", namespace: ns } });
    const mid = new AbortController();
    const t0 = performance.now();
    try {
      for await (const ev of client.watch<KubeObject>(CONFIG_MAPS, ns, { resourceVersion: "0", timeoutSeconds: 30 }, mid.signal)) {
        console.log(performance.now() - t0, ev.type, JSON.stringify(ev.object).slice(0, 150));
        setTimeout(() => mid.abort(), 50);
      }
      console.log("ended", performance.now() - t0, mid.signal.aborted);
    } catch (e) { console.log("threw", performance.now() - t0, e); }
    if (client !== admin) client.close();
  }
  await proxy.close(); admin.close();
});
