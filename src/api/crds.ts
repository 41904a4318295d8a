/** The CustomResourceDefinitions, built from the schemas in types.ts; `deno task crds` writes them to `crds/`. */
import { stringify } from "yaml";
import type { JsonSchema, Schema } from "./schema.ts";
import {
  exporterSetSpecSchema,
  exporterSetStatusSchema,
  exporterSpecSchema,
  exporterStatusSchema,
  JUMPSTARTER_GROUP,
  leaseSpecSchema,
  leaseStatusSchema,
  VERSION,
  VIRTUALTARGET_GROUP,
  virtualTargetClassSpecSchema,
} from "./types.ts";

interface Column {
  name: string;
  type: "string" | "integer" | "date";
  jsonPath: string;
  priority?: number;
}

interface CrdInput {
  group: string;
  kind: string;
  plural: string;
  shortNames?: string[];
  spec: Schema<unknown>;
  status?: Schema<unknown>;
  columns: Column[];
  scale?: { specReplicasPath: string; statusReplicasPath: string; labelSelectorPath: string };
}

export interface Crd {
  apiVersion: "apiextensions.k8s.io/v1";
  kind: "CustomResourceDefinition";
  metadata: { name: string };
  spec: JsonSchema;
}

const age: Column = { name: "Age", type: "date", jsonPath: ".metadata.creationTimestamp" };

function crd(c: CrdInput): Crd {
  const properties: Record<string, JsonSchema> = {
    apiVersion: { type: "string" },
    kind: { type: "string" },
    metadata: { type: "object" },
    spec: c.spec.json,
  };
  if (c.status) properties.status = c.status.json;
  const subresources: JsonSchema = {};
  if (c.status) subresources.status = {};
  if (c.scale) subresources.scale = c.scale;
  return {
    apiVersion: "apiextensions.k8s.io/v1",
    kind: "CustomResourceDefinition",
    metadata: { name: `${c.plural}.${c.group}` },
    spec: {
      group: c.group,
      names: {
        kind: c.kind,
        listKind: `${c.kind}List`,
        plural: c.plural,
        singular: c.kind.toLowerCase(),
        ...(c.shortNames ? { shortNames: c.shortNames } : {}),
        // `kubectl get jumpstarter` lists them next to Jumpstarter's own kinds
        categories: ["jumpstarter"],
      },
      scope: "Namespaced",
      versions: [{
        name: VERSION,
        served: true,
        storage: true,
        additionalPrinterColumns: [...c.columns, age],
        schema: {
          openAPIV3Schema: {
            type: "object",
            ...(c.kind === "VirtualTargetClass" ? { required: ["spec"] } : {}),
            properties,
          },
        },
        ...(Object.keys(subresources).length ? { subresources } : {}),
      }],
    },
  };
}

/** Ours: shipped in crds/ and printed by `qemu-ssh-provisioner crds`. */
export const CRDS: Crd[] = [
  crd({
    group: VIRTUALTARGET_GROUP,
    kind: "VirtualTargetClass",
    plural: "virtualtargetclasses",
    shortNames: ["vtc"],
    spec: virtualTargetClassSpecSchema,
    columns: [
      { name: "Provisioner", type: "string", jsonPath: ".spec.provisioner" },
      { name: "Binding", type: "string", jsonPath: ".spec.bindingMode" },
    ],
  }),
  crd({
    group: VIRTUALTARGET_GROUP,
    kind: "ExporterSet",
    plural: "exportersets",
    shortNames: ["exs"],
    spec: exporterSetSpecSchema,
    status: exporterSetStatusSchema,
    columns: [
      { name: "Class", type: "string", jsonPath: ".spec.virtualTargetClassName" },
      { name: "Min", type: "integer", jsonPath: ".spec.minReplicas" },
      { name: "Max", type: "integer", jsonPath: ".spec.maxReplicas" },
      { name: "Replicas", type: "integer", jsonPath: ".status.replicas" },
      { name: "Ready", type: "integer", jsonPath: ".status.readyReplicas" },
      { name: "Available", type: "integer", jsonPath: ".status.availableReplicas" },
      { name: "Unavailable", type: "integer", jsonPath: ".status.unavailableReplicas", priority: 1 },
      { name: "Leased", type: "integer", jsonPath: ".status.leasedReplicas" },
      { name: "Hosts", type: "string", jsonPath: ".status.hostSummary" },
    ],
    scale: {
      specReplicasPath: ".spec.maxReplicas",
      statusReplicasPath: ".status.replicas",
      labelSelectorPath: ".status.selector",
    },
  }),
];

/**
 * Jumpstarter's own Exporter and Lease, with the fields this controller reads and writes, for tests and the sandbox
 * only (test/crds/): a real cluster has upstream's, which these must never replace.
 */
export const JUMPSTARTER_CRDS: Crd[] = [
  crd({
    group: JUMPSTARTER_GROUP,
    kind: "Exporter",
    plural: "exporters",
    spec: exporterSpecSchema,
    status: exporterStatusSchema,
    columns: [
      { name: "Status", type: "string", jsonPath: ".status.exporterStatus" },
      { name: "Lease", type: "string", jsonPath: ".status.leaseRef.name" },
    ],
  }),
  crd({
    group: JUMPSTARTER_GROUP,
    kind: "Lease",
    plural: "leases",
    spec: leaseSpecSchema,
    status: leaseStatusSchema,
    columns: [
      { name: "Exporter", type: "string", jsonPath: ".status.exporterRef.name" },
      { name: "Ended", type: "string", jsonPath: ".status.ended" },
    ],
  }),
];

/** The file name and its YAML, one per CRD. */
export function crdFiles(crds: Crd[] = CRDS): { name: string; yaml: string }[] {
  return crds.map((c) => ({
    name: `${c.metadata.name}.yaml`,
    yaml: "# Generated by `deno task crds` from src/api/types.ts. Do not edit.\n" +
      stringify(c, { lineWidth: 0 }),
  }));
}

/** `crds/kustomization.yaml`, so `manifests/` can include the CRDs as a kustomize base. */
export function crdKustomization(): string {
  return "# Generated by `deno task crds`. Do not edit.\n" +
    stringify({
      apiVersion: "kustomize.config.k8s.io/v1beta1",
      kind: "Kustomization",
      resources: crdFiles().map((f) => f.name),
    });
}
