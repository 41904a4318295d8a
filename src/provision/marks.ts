/** The marks this controller puts on the Exporters it creates, and how an Exporter names its set. */
import type { Exporter, ExporterSet } from "../api/types.ts";
import { PROVISIONER } from "../api/types.ts";

export const FINALIZER = "qemu-ssh.jumpstarter.dev/teardown";
/** The host of the target annotation, for people to read: written with it (targets.ts targetAnnotations). */
export const HOST_ANNOTATION = "qemu-ssh.jumpstarter.dev/host";
export const SET_LABEL = "qemu-ssh.jumpstarter.dev/exporter-set";
/** Set to "Retain" when the class's reclaimPolicy is Retain: the instance outlives the deletion of its set. */
export const RECLAIM_ANNOTATION = "qemu-ssh.jumpstarter.dev/reclaim-policy";

/**
 * Ours: created by us (our label) and torn down by us (our finalizer). Anything else, even owned by a set of ours or
 * carrying one of the marks, is someone else's to change.
 */
export const isOurs = (e: Exporter) =>
  e.metadata.labels?.[SET_LABEL] !== undefined && !!e.metadata.finalizers?.includes(FINALIZER);

/** The ExporterSet that controls the Exporter, by its owner reference; none once orphaned. */
export const setOwner = (e: Exporter) =>
  e.metadata.ownerReferences?.find((o) => o.controller && o.kind === "ExporterSet");

export function ownerSetName(e: Exporter): string | undefined {
  return setOwner(e)?.name;
}

/**
 * The set whose reconcile looks after the Exporter: its owner's; for one of ours that lost its owner reference
 * (`kubectl delete exporterset --cascade=orphan`), the set its label names, so its deletion is still torn down.
 */
export const routedSetName = (e: Exporter): string | undefined =>
  setOwner(e) ? setOwner(e)!.name : isOurs(e) ? e.metadata.labels![SET_LABEL] : undefined;

/**
 * Whether the instance was ever up on its host, as far as is known: this process applied it (`applied`), or, after a
 * restart, Jumpstarter heard from its exporter, which runs only there (`status.lastSeen`). Only such an instance can
 * be "unseen"; one never deployed is simply not ready.
 */
export const wasDeployed = (e: Exporter, applied: boolean): boolean => applied || !!e.status?.lastSeen;

/** Keys of ours (`qemu-ssh.jumpstarter.dev/...`): what they say about an Exporter only this controller may write. */
const isOurKey = (k: string) => k.startsWith(`${PROVISIONER}/`);

/**
 * The labels and annotations of the set's template without our own keys, and the keys left out. Copied verbatim, a
 * template's `ssh-target` (say, from `kubectl get exporter -o yaml`) made every new Exporter look moved from a host
 * it never was on, and its `reclaim-policy` or `host` lied to the sweep.
 */
export function templateMarks(set: ExporterSet): {
  labels: Record<string, string>;
  annotations: Record<string, string>;
  dropped: string[];
} {
  const meta = set.spec.template?.metadata;
  const keep = (m: Record<string, string> | undefined) =>
    Object.fromEntries(Object.entries(m ?? {}).filter(([k]) => !isOurKey(k)));
  const dropped = [...Object.keys(meta?.labels ?? {}), ...Object.keys(meta?.annotations ?? {})].filter(isOurKey);
  return { labels: keep(meta?.labels), annotations: keep(meta?.annotations), dropped };
}
