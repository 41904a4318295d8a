/**
 * Stands in for the garbage collector that the test control plane lacks (no kube-controller-manager): deletes the
 * token Secrets `<exporter>-exporter` whose owner Exporter is gone. Jumpstarter reuses an existing token Secret and
 * refuses one still owned by a deleted Exporter, so without this a re-created Exporter of the same name would never
 * get a credential. Shared by the fake and the real Jumpstarter.
 */
import type { Exporter, Secret } from "../../src/api/types.ts";
import { isConflict, type KubeClient } from "../../src/kube/client.ts";
import { Informer } from "../../src/kube/informer.ts";
import { EXPORTERS, SECRETS } from "../../src/kube/resources.ts";
import { silentLogger } from "../../src/observe/log.ts";

/** Sweeps once when started and again after every Exporter deletion; bursts of deletions share sweeps. */
export function startTokenSecretCollector(client: KubeClient, namespace?: string): { stop(): Promise<void> } {
  const abort = new AbortController();
  const exporters = new Informer<Exporter>(client, EXPORTERS, { namespace, log: silentLogger });
  let sweeping: Promise<void> | undefined;
  let again = false;
  const sweep = () => {
    if (sweeping) {
      again = true;
      return;
    }
    sweeping = (async () => {
      do {
        again = false;
        await deleteOrphanTokenSecrets(client, namespace).catch((err) => {
          if (!abort.signal.aborted) console.error(`token secret collector: ${err}`);
        });
      } while (again && !abort.signal.aborted);
      sweeping = undefined;
    })();
  };
  exporters.on((type) => type === "DELETED" && sweep());
  exporters.synced.then(sweep);
  const loop = exporters.run(abort.signal);
  return {
    async stop() {
      abort.abort();
      await loop;
      await sweeping;
    },
  };
}

export async function deleteOrphanTokenSecrets(client: KubeClient, namespace?: string): Promise<void> {
  // Secrets before Exporters: an owner is created before its Secret, so one missing from the later list was deleted.
  const secrets = (await client.list<Secret>(SECRETS, namespace)).items;
  const live = new Set((await client.list<Exporter>(EXPORTERS, namespace)).items.map((e) => e.metadata.uid));
  for (const s of secrets) {
    const owner = s.metadata.ownerReferences?.find((o) =>
      o.kind === "Exporter" && o.apiVersion.startsWith("jumpstarter.dev/") && s.metadata.name === `${o.name}-exporter`
    );
    if (!owner || live.has(owner.uid)) continue;
    // The uid precondition spares a Secret that was replaced after the list.
    await client.delete(SECRETS, s.metadata.namespace, s.metadata.name!, s.metadata.uid).catch((err) => {
      if (!isConflict(err)) throw err;
    });
  }
}
