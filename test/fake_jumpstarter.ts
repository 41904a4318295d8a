/**
 * FakeJumpstarterController: plays the part of the real Jumpstarter controller for tests and the sandbox, and only
 * the part this provisioner depends on: for every Exporter it creates the credential Secret `<exporter>-exporter`
 * (key `token`, owner-referenced to the Exporter) and sets `status.credential` and `status.endpoint`. The control
 * plane's garbage collector deletes the Secret with its Exporter, as in a cluster.
 */
import { Buffer } from "node:buffer";
import type { Exporter, Secret } from "../src/api/types.ts";
import { isNotFound, type KubeClient } from "../src/kube/client.ts";
import { Informer } from "../src/kube/informer.ts";
import { EXPORTERS, SECRETS } from "../src/kube/resources.ts";
import { silentLogger } from "../src/observe/log.ts";

export const FAKE_ENDPOINT = "grpc.jumpstarter.sandbox.invalid:443";

export interface FakeJumpstarter {
  /** Issues a new token for an Exporter, as Jumpstarter does on rotation. Returns the token. */
  rotate(namespace: string, exporter: string): Promise<string>;
  /** Exporters given their credential so far: what a benchmark waits on, without listing thousands of them. */
  readonly issued: number;
  stop(): Promise<void>;
}

const newToken = () => `fake-jwt.${crypto.randomUUID()}`;
const b64 = (s: string) => Buffer.from(s).toString("base64");

export function startFakeJumpstarter(client: KubeClient, namespace?: string): FakeJumpstarter {
  const abort = new AbortController();
  const exporters = new Informer<Exporter>(client, EXPORTERS, { namespace, log: silentLogger });
  const inFlight = new Set<string>();
  let issued = 0;
  const issue = async (e: Exporter) => {
    const ns = e.metadata.namespace!;
    const name = e.metadata.name!;
    const secretName = `${name}-exporter`;
    try {
      await client.create<Secret>(SECRETS, {
        metadata: {
          name: secretName,
          namespace: ns,
          ownerReferences: [{ apiVersion: "jumpstarter.dev/v1alpha1", kind: "Exporter", name, uid: e.metadata.uid! }],
        },
        type: "Opaque",
        data: { token: b64(newToken()) },
      }).catch((err) => {
        if ((err as { status?: number }).status !== 409) throw err;
      });
      await client.mergePatch(EXPORTERS, ns, name, {
        status: { credential: { name: secretName }, endpoint: FAKE_ENDPOINT },
      }, "status");
      issued++;
    } catch (err) {
      if (!isNotFound(err)) console.error(`fake jumpstarter: ${name}: ${err}`);
    }
  };
  exporters.on((type, e) => {
    const key = `${e.metadata.namespace}/${e.metadata.name}`;
    if (type === "DELETED" || e.status?.credential || e.metadata.deletionTimestamp || inFlight.has(key)) return;
    inFlight.add(key);
    issue(e).finally(() => inFlight.delete(key));
  });
  const loop = exporters.run(abort.signal);
  return {
    get issued() {
      return issued;
    },
    async rotate(ns, exporter) {
      const token = newToken();
      await client.mergePatch(SECRETS, ns, `${exporter}-exporter`, { data: { token: b64(token) } });
      return token;
    },
    async stop() {
      abort.abort();
      await loop;
    },
  };
}
