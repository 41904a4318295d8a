/** The marks this controller puts on the Exporters it creates, and how an Exporter names its set. */
import type { Exporter } from "../api/types.ts";

export const FINALIZER = "qemu-ssh.jumpstarter.dev/teardown";
export const HOST_ANNOTATION = "qemu-ssh.jumpstarter.dev/host";
export const SET_LABEL = "qemu-ssh.jumpstarter.dev/exporter-set";
/** Set to "Retain" when the class's reclaimPolicy is Retain: the instance outlives the deletion of its set. */
export const RECLAIM_ANNOTATION = "qemu-ssh.jumpstarter.dev/reclaim-policy";

export function ownerSetName(e: Exporter): string | undefined {
  return e.metadata.ownerReferences?.find((o) => o.controller && o.kind === "ExporterSet")?.name;
}
