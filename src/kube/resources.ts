/** The API resources this controller touches. The RBAC manifests grant exactly these. */
import { JUMPSTARTER_GROUP, VERSION, VIRTUALTARGET_GROUP } from "../api/types.ts";
import type { Resource } from "./client.ts";

export const EXPORTER_SETS: Resource = {
  group: VIRTUALTARGET_GROUP,
  version: VERSION,
  plural: "exportersets",
  kind: "ExporterSet",
};
export const VIRTUAL_TARGET_CLASSES: Resource = {
  group: VIRTUALTARGET_GROUP,
  version: VERSION,
  plural: "virtualtargetclasses",
  kind: "VirtualTargetClass",
};
export const EXPORTERS: Resource = {
  group: JUMPSTARTER_GROUP,
  version: VERSION,
  plural: "exporters",
  kind: "Exporter",
};
export const JUMPSTARTER_LEASES: Resource = {
  group: JUMPSTARTER_GROUP,
  version: VERSION,
  plural: "leases",
  kind: "Lease",
};
export const SECRETS: Resource = { group: "", version: "v1", plural: "secrets", kind: "Secret" };
export const CONFIG_MAPS: Resource = { group: "", version: "v1", plural: "configmaps", kind: "ConfigMap" };
export const EVENTS: Resource = { group: "", version: "v1", plural: "events", kind: "Event" };
export const NAMESPACES: Resource = { group: "", version: "v1", plural: "namespaces", kind: "Namespace" };
export const COORDINATION_LEASES: Resource = {
  group: "coordination.k8s.io",
  version: "v1",
  plural: "leases",
  kind: "Lease",
};
export const CRDS: Resource = {
  group: "apiextensions.k8s.io",
  version: "v1",
  plural: "customresourcedefinitions",
  kind: "CustomResourceDefinition",
};
