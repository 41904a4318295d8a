/**
 * The vocabulary of the controller: the custom resources it reads and writes, declared once as schemas from which
 * both the CRDs (`crds/`) and the TypeScript types are derived. Field names, defaults and rules follow upstream
 * Jumpstarter so manifests written for it apply unchanged.
 */
import {
  array,
  boolean,
  enumOf,
  freeForm,
  type Infer,
  integer,
  object,
  optional,
  string,
  stringMap,
} from "./schema.ts";

export const VIRTUALTARGET_GROUP = "virtualtarget.jumpstarter.dev";
export const JUMPSTARTER_GROUP = "jumpstarter.dev";
export const VERSION = "v1alpha1";
export const PROVISIONER = "qemu-ssh.jumpstarter.dev";

// ---------------------------------------------------------------- shared pieces

const dateTime = () => string({ format: "date-time" });

export const conditionSchema = object({
  type: string({ maxLength: 316 }),
  status: enumOf(["True", "False", "Unknown"] as const),
  reason: optional(string({ maxLength: 1024 })),
  message: optional(string({ maxLength: 32768 })),
  lastTransitionTime: optional(dateTime()),
  observedGeneration: optional(integer({ format: "int64", minimum: 0 })),
});
export type Condition = Infer<typeof conditionSchema>;

const labelSelectorSchema = object({
  matchLabels: optional(stringMap()),
  matchExpressions: optional(array(object({
    key: string(),
    operator: enumOf(["In", "NotIn", "Exists", "DoesNotExist"] as const),
    values: optional(array(string())),
  }))),
}, { "x-kubernetes-map-type": "atomic" });
export type LabelSelector = Infer<typeof labelSelectorSchema>;

const localRef = (extra = {}) => object({ name: string({ minLength: 1, ...extra }) });
export type LocalObjectReference = Infer<ReturnType<typeof localRef>>;

export const PULL_POLICIES = ["Always", "IfNotPresent", "Never"] as const;
const imageSchema = object({
  image: optional(string({ minLength: 1 })),
  imagePullPolicy: optional(enumOf(PULL_POLICIES)),
});
const imagesSchema = object({
  exporter: optional(imageSchema),
  runtime: optional(imageSchema),
}, { description: "Container images for the exporter and the runtime; the set's override the class's." });
export type Images = Infer<typeof imagesSchema>;

const parametersSchema = freeForm({
  description: "Provisioner parameters. On an ExporterSet they are deep-merged over the class's " +
    "(maps merge, scalars and lists replace).",
});

// ---------------------------------------------------------------- VirtualTargetClass

/** Defaults here and in provision/overrides.ts (SET_OVERRIDE_DEFAULTS), which also applies them to manifest files. */
const setOverridesSchema = object({
  host: optional(boolean({
    default: true,
    description: "Sets may choose parameters.host.name (one set per lab host, as the seed does).",
  })),
  user: optional(boolean({ default: false, description: "Sets may choose the SSH user (host.user, ssh.user)." })),
  port: optional(boolean({ default: false, description: "Sets may choose the SSH port (host.port, ssh.port)." })),
  devices: optional(array(string({ pattern: "^/dev/[A-Za-z0-9_.+*?/-]+$" }), {
    description: "Host devices sets may add with parameters.runtime.devices: paths under /dev, where * and ? match " +
      "within one path segment (e.g. /dev/ttyUSB*). Empty: none beyond the class's own.",
  })),
}, {
  description: "What ExporterSets of this class may override in parameters. host, user, port and devices are the " +
    "class's unless allowed here; a set's ssh.hostKeyPolicy can only make host-key checking stricter.",
});
export type SetOverrides = Infer<typeof setOverridesSchema>;

export const BINDING_MODES = ["Immediate", "WaitForFirstConsumer"] as const;
export const RECLAIM_POLICIES = ["Delete", "Retain"] as const;

export const virtualTargetClassSpecSchema = object({
  provisioner: string({ minLength: 1, description: "The provisioner that serves this class." }),
  credentialsSecretRef: optional(localRef({ description: "Secret with the SSH key (`ssh-privatekey`)." })),
  parameters: optional(parametersSchema),
  setOverrides: optional(setOverridesSchema),
  bindingMode: optional(enumOf(BINDING_MODES, { default: "Immediate" })),
  reclaimPolicy: optional(enumOf(RECLAIM_POLICIES, { default: "Delete" })),
  scheduling: optional(object({
    nodeSelector: optional(stringMap()),
    tolerations: optional(array(freeForm())),
    resources: optional(freeForm()),
  }, { description: "In-cluster provisioners only; ignored by qemu-ssh." })),
  caBundleConfigMapRef: optional(object({
    name: string({ minLength: 1 }),
    key: optional(string({ default: "ca-bundle.crt" })),
  })),
  images: optional(imagesSchema),
});
export type VirtualTargetClassSpec = Infer<typeof virtualTargetClassSpecSchema>;

// ---------------------------------------------------------------- ExporterSet

export const RECYCLE_STRATEGIES = ["ExitAndReplace", "InPlaceReuse"] as const;
export const DEFAULTS = {
  minReplicas: 0,
  maxReplicas: 4,
  minAvailableReplicas: 0,
  scaleDownCooldown: "5m",
  recycleStrategy: "ExitAndReplace",
} as const;

const driverSchema = object({
  name: string({ minLength: 1, pattern: "^[A-Za-z_][A-Za-z0-9_-]*$" }),
  type: optional(string({ minLength: 1 })),
  ref: optional(string({ minLength: 1 })),
  config: optional(freeForm()),
}, {
  "x-kubernetes-validations": [{ rule: "has(self.type) != has(self.ref)", message: "set exactly one of type or ref" }],
});
export type DriverSpec = Infer<typeof driverSchema>;

export const exporterSetSpecSchema = object({
  minReplicas: optional(integer({ minimum: 0, default: DEFAULTS.minReplicas })),
  maxReplicas: optional(integer({ minimum: 0, default: DEFAULTS.maxReplicas, description: "0 means unbounded." })),
  minAvailableReplicas: optional(integer({
    minimum: 0,
    default: DEFAULTS.minAvailableReplicas,
    description: "Idle (unleased) exporters to keep warm.",
  })),
  scaleDownCooldown: optional(string({
    default: DEFAULTS.scaleDownCooldown,
    pattern: "^([0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$",
    description: "How long a surplus must last before scaling down (Go duration, e.g. 5m).",
  })),
  recycleStrategy: optional(enumOf(RECYCLE_STRATEGIES, { default: DEFAULTS.recycleStrategy })),
  virtualTargetClassName: string({ minLength: 1 }),
  parameters: optional(parametersSchema),
  images: optional(imagesSchema),
  selector: optional(labelSelectorSchema),
  template: optional(object({
    metadata: optional(object({ labels: optional(stringMap()), annotations: optional(stringMap()) })),
    spec: optional(object({ drivers: optional(array(driverSchema, { "x-kubernetes-list-type": "atomic" })) })),
  })),
}, {
  "x-kubernetes-validations": [
    {
      rule: "!has(self.maxReplicas) || self.maxReplicas == 0 || !has(self.minReplicas) || " +
        "self.minReplicas <= self.maxReplicas",
      message: "minReplicas must be <= maxReplicas (unless maxReplicas is 0, unbounded)",
    },
    {
      rule: "!has(self.maxReplicas) || self.maxReplicas == 0 || !has(self.minAvailableReplicas) || " +
        "self.minAvailableReplicas <= self.maxReplicas",
      message: "minAvailableReplicas must be <= maxReplicas (unless maxReplicas is 0, unbounded)",
    },
  ],
});
export type ExporterSetSpec = Infer<typeof exporterSetSpecSchema>;

const count = () => optional(integer({ minimum: 0 }));
export const exporterSetStatusSchema = object({
  observedGeneration: optional(integer({ format: "int64" })),
  replicas: count(),
  readyReplicas: count(),
  availableReplicas: count(),
  unavailableReplicas: count(),
  leasedReplicas: count(),
  updatedReplicas: optional(integer({
    minimum: 0,
    description: "Exporters running the current template; a leased one waits for its lease to end to be restarted.",
  })),
  exportersActive: count(),
  exportersIdle: count(),
  exportersDisabled: count(),
  exportersOffline: count(),
  selector: optional(string({ description: "Label selector of the exporters, in string form (scale subresource)." })),
  surplusSince: optional(string({ format: "date-time", description: "Since when more exporters run than needed." })),
  conditions: optional(array(conditionSchema, {
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["type"],
  })),
  hosts: optional(array(
    object({
      name: string(),
      instances: integer({ minimum: 0 }),
      slots: optional(integer({ minimum: 0, description: "Absent: no bound of its own." })),
      reachable: boolean(),
      lastError: optional(string({ description: "Why it does not answer, while it does not." })),
    }),
    { description: "A pooled set's lab hosts (parameters.hosts) and the instances on each." },
  )),
  hostSummary: optional(string({ description: "status.hosts in one line: name instances/slots, for kubectl get." })),
});
export type ExporterSetStatus = Infer<typeof exporterSetStatusSchema>;

// ---------------------------------------------------------------- Exporter and Lease (owned by Jumpstarter)

export const exporterSpecSchema = object({
  username: optional(string()),
  enabled: optional(boolean({ default: true, description: "false: no new leases (drained before removal)." })),
}, { "x-kubernetes-preserve-unknown-fields": true });
export type ExporterSpec = Infer<typeof exporterSpecSchema>;

export const exporterStatusSchema = object({
  conditions: optional(array(conditionSchema)),
  credential: optional(localRef()),
  devices: optional(array(freeForm())),
  leaseRef: optional(localRef()),
  lastSeen: optional(dateTime()),
  endpoint: optional(string()),
  exporterStatus: optional(string()),
  statusMessage: optional(string()),
}, { "x-kubernetes-preserve-unknown-fields": true });
export type ExporterStatus = Infer<typeof exporterStatusSchema>;

export const leaseSpecSchema = object({
  selector: optional(labelSelectorSchema),
  exporterRef: optional(localRef()),
  clientRef: optional(localRef()),
  duration: optional(string()),
  release: optional(boolean()),
}, { "x-kubernetes-preserve-unknown-fields": true });
export type LeaseSpec = Infer<typeof leaseSpecSchema>;

export const leaseStatusSchema = object({
  exporterRef: optional(localRef()),
  ended: optional(boolean()),
  conditions: optional(array(conditionSchema)),
}, { "x-kubernetes-preserve-unknown-fields": true });
export type LeaseStatus = Infer<typeof leaseStatusSchema>;

// ---------------------------------------------------------------- object envelopes

export interface OwnerReference {
  apiVersion: string;
  kind: string;
  name: string;
  uid: string;
  controller?: boolean;
  blockOwnerDeletion?: boolean;
}

export interface ObjectMeta {
  name?: string;
  generateName?: string;
  namespace?: string;
  uid?: string;
  resourceVersion?: string;
  generation?: number;
  creationTimestamp?: string;
  deletionTimestamp?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  ownerReferences?: OwnerReference[];
  finalizers?: string[];
}

export interface KubeObject {
  apiVersion?: string;
  kind?: string;
  metadata: ObjectMeta;
}

export interface VirtualTargetClass extends KubeObject {
  spec: VirtualTargetClassSpec;
}
export interface ExporterSet extends KubeObject {
  spec: ExporterSetSpec;
  status?: ExporterSetStatus;
}
export interface Exporter extends KubeObject {
  spec?: ExporterSpec;
  status?: ExporterStatus;
}
export interface Lease extends KubeObject {
  spec?: LeaseSpec;
  status?: LeaseStatus;
}
export interface Secret extends KubeObject {
  type?: string;
  data?: Record<string, string>;
}
export interface ConfigMap extends KubeObject {
  data?: Record<string, string>;
}
