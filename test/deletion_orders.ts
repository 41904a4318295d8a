/**
 * The orders in which a user deletes what the seed applied (issue 18, Why 2), shared by the e2e deletion test and the
 * fault suite's deletion world: each deletes from the first delete on, through the API as kubectl would, and needs
 * only a client and the namespace (the e2e World and the fault world both have them).
 */
import { Buffer } from "node:buffer";
import { waitFor } from "./env.ts";
import { CLASS, SET } from "./e2e_world.ts";
import { ed25519Key } from "./fixtures.ts";
import type { KubeClient } from "../src/kube/client.ts";
import { EXPORTER_SETS, NAMESPACES, SECRETS, VIRTUAL_TARGET_CLASSES } from "../src/kube/resources.ts";
import type { ExporterSet, Secret } from "../src/api/types.ts";

const KEY_SECRET = "lab-ssh-key";

export interface Seeded {
  client: KubeClient;
  ns: string;
}

export interface DeletionOrder<W extends Seeded = Seeded> {
  name: string;
  /** Deletes, from the first delete on. */
  run(w: W): Promise<void>;
  /** The namespace itself goes. */
  namespaceGone?: boolean;
  /**
   * No key the host takes is left in the cluster (the Secret goes, or its key is rotated): only the controller's
   * memory of the key the host took can reach it, which a restart loses (README, "Removal and the sweep").
   */
  keyGone?: boolean;
}

export const deleteSeeded = (w: Seeded, what: "secret" | "class" | "set") =>
  what === "secret"
    ? w.client.delete(SECRETS, w.ns, KEY_SECRET)
    : what === "class"
    ? w.client.delete(VIRTUAL_TARGET_CLASSES, w.ns, CLASS)
    : w.client.delete(EXPORTER_SETS, w.ns, SET);

/** The set's Degraded reason once it is `reason`: the controller has seen what went. */
export const degradedBy = (w: Seeded, reason: string, timeoutMs?: number) =>
  waitFor(async () => {
    const set = await w.client.get<ExporterSet>(EXPORTER_SETS, w.ns, SET);
    return set.status?.conditions?.find((c) => c.type === "Degraded")?.reason === reason;
  }, { what: `Degraded ${reason}`, timeoutMs });

export const DELETION_ORDERS: DeletionOrder[] = [
  {
    name: "kubectl delete -f of the seed file (Secret, class, set in file order)",
    keyGone: true,
    async run(w) {
      for (const x of ["secret", "class", "set"] as const) await deleteSeeded(w, x);
    },
  },
  {
    name: "kubectl delete namespace",
    keyGone: true,
    namespaceGone: true,
    run: (w) => w.client.delete(NAMESPACES, undefined, w.ns),
  },
  {
    name: "the class deleted first",
    async run(w) {
      await deleteSeeded(w, "class");
      await degradedBy(w, "VirtualTargetClassNotFound");
      await deleteSeeded(w, "set");
    },
  },
  {
    name: "the Secret deleted first",
    keyGone: true,
    async run(w) {
      await deleteSeeded(w, "secret");
      await degradedBy(w, "CredentialsNotFound");
      await deleteSeeded(w, "set");
    },
  },
  {
    name: "the Secret's key rotated to one the host does not take yet",
    keyGone: true,
    async run(w) {
      const key = Buffer.from(await ed25519Key("rotated")).toString("base64");
      await w.client.mergePatch<Secret>(SECRETS, w.ns, KEY_SECRET, { data: { "ssh-privatekey": key } });
      await deleteSeeded(w, "set");
    },
  },
];
