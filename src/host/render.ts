/**
 * What one instance is on its lab host: the ExporterConfig and the two Podman quadlets, as data. Pure: the remote
 * scripts (remote.ts) put these files in place; nothing here touches a host.
 */
import { Buffer } from "node:buffer";
import { Document, Scalar, type ScalarTag, type Tags, visit } from "yaml";
import type { DriverSpec, ExporterSet, VirtualTargetClass } from "../api/types.ts";
import { DEFAULTS, PROVISIONER } from "../api/types.ts";
import { type InstanceParams, type PullPolicy, QEMU_DRIVER_TYPE, qemuQuantity } from "./instance_params.ts";
import { NEWEST_DIALECT, OLDEST_DIALECT, type QuadletDialect, quadletDialect } from "./quadlet_dialect.ts";
import { type HostFacts, kvmAccess } from "./host_facts.ts";

export interface Instance {
  namespace: string;
  /** The Exporter's name; also names the units, containers, volume and files on the host. */
  name: string;
  /** The Exporter's uid: tells our files apart from another namespace's exporter of the same name. */
  uid: string;
  setName: string;
  params: InstanceParams;
  drivers: DriverSpec[];
  exitOnLeaseEnd: boolean;
  endpoint: string;
  token: string;
  /** PEM text, may be "". */
  caBundle: string;
  /** reclaimPolicy Retain: recorded on the host so the orphan sweep leaves the instance of a deleted set alone. */
  retain?: boolean;
  /**
   * The uid of the ExporterSet: a retained instance belongs to that set, not to a later one of the same name (the
   * sweep compares it). Absent offline (`render`).
   */
  setUid?: string;
  /**
   * Which controller owns the instance (controllerIdentity: cluster id and provisioner): the orphan sweep removes only
   * its own, so clusters sharing a lab host leave each other's instances alone. Absent offline (`render`).
   */
  controller?: string;
  /**
   * The images whose imagePullPolicy the class or set states. For the others `pullPolicy` is only the default
   * (IfNotPresent), and they are pulled as Kubernetes defaults them: see `pullOf`. Absent: none is stated.
   */
  statedPullPolicy?: ImageRole[];
}

export type ImageRole = "exporter" | "runtime";

/** The roles whose `spec.images.<role>.imagePullPolicy` the set or its class states. */
export function statedPullPolicy(cls: VirtualTargetClass, set: ExporterSet): ImageRole[] {
  return (["exporter", "runtime"] as const).filter((role) =>
    set.spec.images?.[role]?.imagePullPolicy !== undefined || cls.spec.images?.[role]?.imagePullPolicy !== undefined
  );
}

/**
 * One Exporter of a set as an instance: the set's drivers and recycle strategy over the resolved parameters, and which
 * pull policies the set and class state.
 */
export function instanceOf(
  set: ExporterSet,
  cls: VirtualTargetClass,
  params: InstanceParams,
  exporter: Pick<Instance, "name" | "uid" | "endpoint" | "token" | "caBundle" | "retain" | "controller">,
): Instance {
  return {
    ...exporter,
    namespace: set.metadata.namespace!,
    setName: set.metadata.name!,
    setUid: set.metadata.uid,
    params,
    drivers: set.spec.template?.spec?.drivers ?? [],
    exitOnLeaseEnd: (set.spec.recycleStrategy ?? DEFAULTS.recycleStrategy) === "ExitAndReplace",
    statedPullPolicy: statedPullPolicy(cls, set),
  };
}

export interface RenderedFile {
  path: string;
  content: string;
  mode: number;
  /** Owner (uid and gid) of the file and of its directory: the exporter's user must read its own config. */
  owner: number;
  secret: boolean;
  /** Further names kept as hard links to this file (same inode), each replaced atomically. */
  links: string[];
}

export interface RenderedInstance {
  name: string;
  /** The Exporter's namespace, which the volume's labels carry (see remote.ts). */
  namespace: string;
  /** The Exporter's uid, which the ownership lines carry: the apply script refuses files naming another. */
  uid: string;
  /** The controller identity, which the volume's labels carry beside the uid. */
  controller?: string;
  /** The volume shared by both containers: "jumpstarter-<name>-shared". */
  volume: string;
  /** The guest's disks, mounted at /disk in both containers: a volume backed by a file system image of this size. */
  disk: { volume: string; image: string; bytes: number };
  files: RenderedFile[];
  /** Service names. */
  units: { runtime: string; exporter: string };
  /** Host device paths the containers require (runtime.devices; /dev/kvm is optional and checked separately). */
  devices: string[];
  /** The host's facts the files were rendered for; undefined: none known yet (the apply script refuses them). */
  facts?: HostFacts;
}

export const CONFIG_DIR = "/etc/jumpstarter/exporters";
export const QUADLET_DIR = "/etc/containers/systemd";
export const LAUNCHER_SOCKET = "/shared/launcher.sock";
export const TCP_DRIVER_TYPE = "jumpstarter_driver_network.driver.TcpNetwork";
export const SSH_FORWARD_PORT = 2222;
/**
 * Upstream's container contract: the exporter runs as this non-root uid (and gid) and the runtime as root, whatever
 * the images say, so QEMU can open devices while `jmp run` holds no privilege.
 */
export const EXPORTER_UID = 65532;
/** Where the exporter image carries the launcher, which is staged onto the shared volume before the runtime starts. */
export const EXEC_IN_EXPORTER_IMAGE = "/jumpstarter/bin/jumpstarter-exec";
/** The launcher's name on the shared volume: the runtime image runs /shared/jumpstarter-exec. */
export const STAGED_NAME = "jumpstarter-exec";
/** Firmware the QEMU driver boots unless the template names its own, by guest arch (upstream's defaults). */
const DEFAULT_PARTITIONS: Record<string, Json> = {
  aarch64: { "OVMF_CODE.fd": "/usr/share/AAVMF/AAVMF_CODE.fd", "OVMF_VARS.fd": "/usr/share/AAVMF/AAVMF_VARS.fd" },
  other: { "OVMF_CODE.fd": "/usr/share/edk2/ovmf/OVMF_CODE.fd", "OVMF_VARS.fd": "/usr/share/edk2/ovmf/OVMF_VARS.fd" },
};
export const MANAGED_HEADER = `# Managed by ${PROVISIONER}; do not edit.`;
/** On containers and the volume: the controller identity, as in the ownership line (see controllerIdentity). */
export const CONTROLLER_LABEL = `${PROVISIONER}/controller`;
/** Starts the machine-readable ownership line in every file we write (remote.ts reads it back on the host). */
export const OWNER_PREFIX = `# ${PROVISIONER}/owner: `;

export const configPath = (name: string) => `${CONFIG_DIR}/${name}.yaml`;
/**
 * The exporter container mounts this per-instance directory, not the config file: a bind mount of a single file pins
 * its inode, so an atomic rename on the host (the only update that never exposes a half-written token) would stay
 * invisible to the container until it restarts, and the SIGHUP reload after a token rotation would re-read the old
 * token. A directory mount sees the rename. The directory holds only this instance's config, so no exporter can read
 * another one's token; the top-level `<name>.yaml` is a hard link to the same file for people and tools that look
 * there.
 */
export const configMountDir = (name: string) => `${CONFIG_DIR}/${name}.d`;
export const quadletPath = (unit: string) => `${QUADLET_DIR}/${unit}.container`;
export const volumeName = (name: string) => `jumpstarter-${name}-shared`;
/**
 * Upstream main's (#928) QEMU driver keeps root, bios and OVMF partitions in /disk in launcher mode, and QEMU opens
 * them in the runtime: both containers mount the same volume there, as the in-cluster pod does.
 */
export const DISK_MOUNT = "/disk";
export const diskVolumeName = (name: string) => `jumpstarter-${name}-disk`;
/** What the scripts keep on the host across reboots. */
const STATE_DIR = `/var/lib/${PROVISIONER}`;
/** Where the /disk volumes' file system images live on the host (doctor checks its free space). */
export const DISK_DIR = `${STATE_DIR}/disks`;
export const diskImagePath = (name: string) => `${DISK_DIR}/${name}.img`;
/**
 * The host's one copy of scripts/stage.sh, shared by every instance's runtime (its ExecStartPre): every apply writes
 * it (remote.ts STAGE_SCRIPT_TEXT), under the host lock, without restarting anything.
 */
export const STAGE_SCRIPT = `${STATE_DIR}/stage-launcher.sh`;
/** Where stage.sh keeps each exporter image's launcher, by image id: copied out of an image once. */
export const LAUNCHER_CACHE = `${STATE_DIR}/launchers`;
/** The container stage.sh copies the launcher out of (never started); it removes it, the remove script any a crash left. */
export const stageContainer = (name: string) => `${name}-stage`;

const PULL: Record<PullPolicy, string> = { Always: "always", IfNotPresent: "missing", Never: "never" };

/** Whether an image reference floats: no digest, and the tag `latest` or none (which means `latest`). */
export function floatingImage(image: string): boolean {
  if (image.includes("@")) return false;
  const last = image.slice(image.lastIndexOf("/") + 1);
  const colon = last.indexOf(":");
  return colon < 0 || last.slice(colon + 1) === "latest";
}

/**
 * Podman's pull policy for one image (quadlet `Pull=`, `podman run --pull`). A stated imagePullPolicy is followed as
 * written. Unstated, as Kubernetes defaults it: a floating image (`:latest`, untagged) is looked up on every start and
 * pulled when the registry's digest differs (`newer`, Kubernetes' Always; Podman uses the local image when the
 * registry cannot be reached), any other only when it is missing.
 */
export function pullOf(inst: Instance, role: ImageRole): string {
  const { image, pullPolicy } = inst.params.images[role];
  const stated = inst.statedPullPolicy?.includes(role) || pullPolicy !== "IfNotPresent";
  return !stated && floatingImage(image) ? "newer" : PULL[pullPolicy];
}

// Kubernetes validated these already; they are re-checked because they become file, unit and container names.
const DNS_SUBDOMAIN_RE = /^[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?$/;
const DNS_LABEL_RE = /^[a-z0-9](?:[-a-z0-9]*[a-z0-9])?$/;
const UID_RE = /^[A-Za-z0-9-]{1,64}$/;

function checkIdentity(inst: Instance) {
  // 200 leaves room for "-exporter.container" within the 255-byte limits on file and unit names
  const bad = (what: string, v: string) => new Error(`refusing to render: ${what} ${JSON.stringify(v)} is not valid`);
  if (!DNS_SUBDOMAIN_RE.test(inst.name) || inst.name.length > 200) throw bad("exporter name", inst.name);
  if (!DNS_LABEL_RE.test(inst.namespace) || inst.namespace.length > 63) throw bad("namespace", inst.namespace);
  if (!DNS_SUBDOMAIN_RE.test(inst.setName) || inst.setName.length > 253) throw bad("ExporterSet name", inst.setName);
  if (!UID_RE.test(inst.uid)) throw bad("uid", inst.uid);
  if (inst.setUid !== undefined && !UID_RE.test(inst.setUid)) throw bad("ExporterSet uid", inst.setUid);
  if (inst.controller !== undefined && !CONTROLLER_RE.test(inst.controller)) {
    throw bad("controller identity", inst.controller);
  }
}

const CONTROLLER_RE = /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}\/[a-z0-9][-a-z0-9.]{0,252}$/;
/** A cluster id as `--cluster-id` takes it: one word, safe in an ownership line and a label. */
export const CLUSTER_ID_RE = /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/;

/**
 * The identity a controller writes into the ownership lines and labels of its instances: which cluster (the uid of
 * its kube-system namespace, or `--cluster-id`) and which provisioner. Two controllers differ in it even when they
 * serve the same namespace name.
 */
export const controllerIdentity = (clusterId: string, provisioner: string) => `${clusterId}/${provisioner}`;

/**
 * A value for a unit file line: systemd expands `%` specifiers in quadlet values and a newline would start a new
 * key, so `%` is doubled and control characters are refused (there is no escape for them in a unit file).
 */
export function unitValue(v: string): string {
  // deno-lint-ignore no-control-regex
  if (/[\x00-\x1f\x7f]/.test(v)) {
    throw new Error(`refusing a control character in a unit file value: ${JSON.stringify(v)}`);
  }
  return v.replaceAll("%", "%%");
}

/** The uid stays last: the host scripts read it from the end of the line (remote.ts owner_uid). */
export function ownerLine(
  inst: Pick<Instance, "namespace" | "setName" | "name" | "uid" | "retain" | "setUid" | "controller">,
): string {
  const setUid = inst.setUid ? ` set-uid=${inst.setUid}` : "";
  const retain = inst.retain ? " reclaim=Retain" : "";
  const controller = inst.controller ? ` controller=${inst.controller}` : "";
  return `${OWNER_PREFIX}namespace=${inst.namespace} set=${inst.setName}${setUid} exporter=${inst.name}${retain}` +
    `${controller} uid=${inst.uid}`;
}

/**
 * The quadlet dialect to render for a host's Podman version. Unknown: the newest. Below quadlet (MIN_PODMAN) the apply
 * script refuses the host before it writes anything, so what is rendered for it never reaches a generator; the oldest
 * dialect keeps rendering total.
 */
export function dialectOf(podman: string | undefined): QuadletDialect {
  if (podman === undefined) return NEWEST_DIALECT;
  const d = quadletDialect(podman);
  return d === "too-old" ? OLDEST_DIALECT : d;
}

/** The instance's files for a host with these facts (undefined: not known yet, see host_facts.ts). */
export function renderInstance(inst: Instance, facts?: HostFacts): RenderedInstance {
  checkIdentity(inst);
  const dialect = dialectOf(facts?.podman);
  const units = { runtime: `${inst.name}-runtime`, exporter: `${inst.name}-exporter` };
  const header = [MANAGED_HEADER, ownerLine(inst)];
  const mountDir = configMountDir(inst.name);
  return {
    name: inst.name,
    namespace: inst.namespace,
    uid: inst.uid,
    controller: inst.controller,
    volume: volumeName(inst.name),
    disk: { volume: diskVolumeName(inst.name), image: diskImagePath(inst.name), bytes: inst.params.diskBytes },
    // The config's real home is the mounted directory: a replacement is created there, so on SELinux hosts it
    // inherits the label podman gave that directory, and the top-level name follows as a link.
    files: [
      {
        path: `${mountDir}/${inst.name}.yaml`,
        content: [...header, renderConfig(inst)].join("\n"),
        mode: 0o600,
        owner: EXPORTER_UID,
        secret: true,
        links: [configPath(inst.name)],
      },
      quadletFile(units.runtime, renderRuntime(inst, header, dialect)),
      quadletFile(units.exporter, renderExporter(inst, header, dialect, facts)),
    ],
    units: { runtime: `${units.runtime}.service`, exporter: `${units.exporter}.service` },
    devices: inst.params.runtime.devices.map((d) => d.split(":")[0]),
    ...(facts ? { facts } : {}),
  };
}

const quadletFile = (unit: string, content: string): RenderedFile => ({
  path: quadletPath(unit),
  content,
  mode: 0o644,
  owner: 0,
  secret: false,
  links: [],
});

// ---------------------------------------------------------------- ExporterConfig

type Json = Record<string, unknown>;
const isMap = (v: unknown): v is Json => typeof v === "object" && v !== null && !Array.isArray(v);

export function renderConfig(inst: Instance): string {
  const config = {
    apiVersion: "jumpstarter.dev/v1alpha1",
    kind: "ExporterConfig",
    metadata: { namespace: inst.namespace, name: inst.name },
    endpoint: inst.endpoint,
    token: inst.token,
    tls: { ca: Buffer.from(inst.caBundle, "utf8").toString("base64"), insecure: false },
    exitOnLeaseEnd: inst.exitOnLeaseEnd,
    export: exportDrivers(inst.drivers, inst.params),
  };
  return exporterYaml(config);
}

// The exporter reads its config with PyYAML, a YAML 1.1 reader: there `no`, `on`, `1:30`, `2024-01-01` and `0b1`
// are not strings, a float needs a dot, `=` and `<<` are tags it cannot construct, a tab ends a plain scalar, and
// U+0085, U+2028, U+2029 break lines while DEL, C1 controls, U+FFFE and U+FFFF are refused even in quotes.
const PY_UNSAFE = /[\t\x7f-\x9f\u2028\u2029\ufffe\uffff]|^(?:=|<<)$/;
const PY_ESCAPE = /[\x7f-\x9f\u2028\u2029\ufffe\uffff]/g;
const pyEscape = (c: string) =>
  ({ "\u0085": "\\N", "\u2028": "\\L", "\u2029": "\\P" })[c] ?? `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`;
const dottedFloat: ScalarTag = {
  tag: "tag:yaml.org,2002:float",
  identify: (v) => typeof v === "number" && Number.isFinite(v) && /e/.test(String(v)) && !String(v).includes("."),
  resolve: (s: string) => Number(s),
  stringify: ({ value }) => String(value).replace("e", ".0e"),
};
// the 1.1 schema would write the string "<<" as a merge key
const noMerge = (tags: Tags) => tags.filter((t) => typeof t === "string" || t.tag !== "tag:yaml.org,2002:merge");

function exporterYaml(config: unknown): string {
  // no aliases: every driver stands alone
  const doc = new Document(config, {
    version: "1.1",
    aliasDuplicateObjects: false,
    customTags: (tags) => [dottedFloat, ...noMerge(tags)],
  });
  visit(doc, {
    Scalar(_, n) {
      if (typeof n.value === "string" && PY_UNSAFE.test(n.value)) n.type = Scalar.QUOTE_DOUBLE;
    },
  });
  // lineWidth 0: a folded token is valid YAML but hard to compare by eye. The escapes are safe on the whole text:
  // these characters only occur in strings, and every such string is double-quoted above.
  return doc.toString({ lineWidth: 0 }).replace(PY_ESCAPE, pyEscape);
}

/**
 * The template's drivers with upstream's enrichment of the QEMU driver, its `power` alias and the auto-injected tcp
 * driver.
 */
export function exportDrivers(drivers: DriverSpec[], params: InstanceParams): Json {
  const out: Json = {};
  let sshPort = SSH_FORWARD_PORT;
  for (const d of drivers) {
    if (d.ref !== undefined) {
      out[d.name] = { ref: d.ref };
      continue;
    }
    let config: Json = isMap(d.config) ? structuredClone(d.config) : {};
    if (d.type === QEMU_DRIVER_TYPE) {
      config = enrichQemu(config, params);
      const port = ((config.hostfwd as Json).ssh as Json | undefined)?.hostport;
      if (Number.isInteger(port)) sshPort = port as number;
    }
    out[d.name] = { type: d.type, config };
  }
  // upstream main's alias, so `j power on` works as with its other drivers: the 0.9.0 exporter resolves a top-level
  // ref through the export tree (jumpstarter_driver_composite.Proxy), where the QEMU driver keeps its own `power` child
  const qemu = drivers.find((d) => d.ref === undefined && d.type === QEMU_DRIVER_TYPE);
  if (qemu && !("power" in out)) out.power = { ref: `${qemu.name}.power` };
  const hasTcp = Object.entries(out).some(([name, d]) => name === "tcp" || (d as Json).type === TCP_DRIVER_TYPE);
  // the tcp driver follows the ssh forward, which the template may have moved
  if (!hasTcp) out.tcp = { type: TCP_DRIVER_TYPE, config: { host: "127.0.0.1", port: sshPort } };
  return out;
}

function enrichQemu(config: Json, params: InstanceParams): Json {
  const defaults: Json = {};
  if (params.arch) defaults.arch = params.arch;
  if (params.cpu !== undefined) defaults.smp = params.cpu;
  if (params.memory) defaults.mem = qemuQuantity(params.memory);
  if (params.storage) defaults.disk_size = qemuQuantity(params.storage);
  const hostfwd = {
    ssh: { protocol: "tcp", hostaddr: "127.0.0.1", hostport: SSH_FORWARD_PORT, guestport: 22 },
    ...(isMap(config.hostfwd) ? config.hostfwd : {}),
  };
  const merged: Json = { ...defaults, ...config, hostfwd };
  if (!("default_partitions" in merged)) {
    merged.default_partitions = DEFAULT_PARTITIONS[merged.arch === "aarch64" ? "aarch64" : "other"];
  }
  // the launcher socket is where the runtime container listens, so it is not the template's to choose
  return { ...merged, launcher_socket: LAUNCHER_SOCKET };
}

// ---------------------------------------------------------------- quadlets

function unit(sections: [string, [string, string][]][], header: string[]): string {
  const lines = [...header];
  for (const [name, keys] of sections) {
    lines.push("", `[${name}]`, ...keys.map(([k, v]) => `${k}=${unitValue(v)}`));
  }
  return lines.join("\n") + "\n";
}

function commonContainerKeys(inst: Instance, role: ImageRole, d: QuadletDialect): [string, string][] {
  const p = inst.params;
  const image = p.images[role];
  const keys: [string, string][] = [
    ["Image", image.image],
    d.pullKey ? ["Pull", pullOf(inst, role)] : ["PodmanArgs", `--pull=${pullOf(inst, role)}`],
    ["ContainerName", `${inst.name}-${role}`],
    ["Label", `jumpstarter.dev/exporter=${inst.name}`],
    ["Label", `jumpstarter.dev/namespace=${inst.namespace}`],
    ["Label", `${PROVISIONER}/exporterset=${inst.setName}`],
    ["Label", `${PROVISIONER}/uid=${inst.uid}`],
    ...inst.controller ? [["Label", `${CONTROLLER_LABEL}=${inst.controller}`] as [string, string]] : [],
    ["Label", `${PROVISIONER}/role=${role}`],
    // `z`: both containers share the volume, so on SELinux hosts it needs the shared label, not a private one
    ["Volume", `${volumeName(inst.name)}:/shared:z`],
    // `U` on the exporter's: Podman 4 hands a fresh volume's root to the user of the first container that mounts it,
    // the root runtime, and the exporter (65532) writes the flashed images there; U gives it back at each start.
    ["Volume", `${diskVolumeName(inst.name)}:${DISK_MOUNT}:${role === "exporter" ? "z,U" : "z"}`],
  ];
  // Both containers get /dev/kvm: QEMU runs in the runtime, but the driver in the exporter checks /dev/kvm to decide
  // on KVM acceleration. `-`: start even if it is missing; the apply script checks for it when KVM is required. A
  // quadlet without `-` gets the plain path: the same check refuses a host without it before anything starts.
  if (p.runtime.kvm) keys.push(["AddDevice", d.optionalDevice ? "-/dev/kvm" : "/dev/kvm"]);
  // Extra devices go to both as well: QEMU passes them through, and drivers in the exporter (serial consoles,
  // power switches next to the virtual target) open them directly. A device is only opened by whoever uses it.
  for (const d of p.runtime.devices) keys.push(["AddDevice", d]);
  return keys;
}

function service(restart: "always" | "on-failure", extra: [string, string][] = []): [string, [string, string][]] {
  return ["Service", [
    ...extra,
    ["Restart", restart],
    // a few seconds between restarts keeps a crash loop from exhausting systemd's start limit in a blink
    ["RestartSec", "3"],
    // generous: the first start may pull a multi-GB image
    ["TimeoutStartSec", "900"],
  ]];
}
// quadlet units cannot be `systemctl enable`d; [Install] is how they start at boot
const install: [string, [string, string][]] = ["Install", [["WantedBy", "multi-user.target"]]];

function renderRuntime(inst: Instance, header: string[], d: QuadletDialect): string {
  return unit([
    ["Unit", [["Description", `Jumpstarter QEMU runtime of ${inst.namespace}/${inst.name} (set ${inst.setName})`]]],
    ["Container", [
      ...commonContainerKeys(inst, "runtime", d),
      // the image says USER 65532; QEMU needs root for devices, as upstream runs it
      ["User", "0"],
      // the /disk size is part of the instance's definition: a larger one restarts it (deferred while leased), and
      // the apply grows the file system offline between the stop and the start
      ["Label", `${PROVISIONER}/disk-bytes=${inst.params.diskBytes}`],
      [
        "Environment",
        `JUMPSTARTER_EXEC_LOG_FIELDS=component=exporter,exporter=${inst.name},namespace=${inst.namespace}`,
      ],
    ]],
    service("always", [["ExecStartPre", stageCommand(inst)]]),
    install,
  ], header);
}

/**
 * The runtime image runs /shared/jumpstarter-exec, which only the exporter image carries: stage.sh resolves the
 * exporter image as its pull policy says and puts that image's launcher onto the shared volume before every start of
 * the runtime, so a new exporter image (or a volume re-created by hand) always brings its own. Values as arguments:
 * systemd splits the line on blanks, which none of them holds.
 */
function stageCommand(inst: Instance): string {
  return [
    "/bin/sh",
    STAGE_SCRIPT,
    pullOf(inst, "exporter"),
    inst.params.images.exporter.image,
    volumeName(inst.name),
    stageContainer(inst.name),
  ].join(" ");
}

/**
 * The exporter is not root, and the QEMU driver in it decides on KVM by whether this uid can open /dev/kvm (with the
 * 0.9.0 exporter QEMU even runs there): on a host where the node is its group's (0660 root:kvm), the container gets
 * that group. By number, as a name would be looked up in the image's /etc/group. `PodmanArgs=` rather than
 * `GroupAdd=`, which Podman 4.9.3's quadlet does not know (it refuses the whole unit). The runtime runs as root, which
 * opens the node without it.
 */
function kvmGroupKeys(inst: Instance, facts: HostFacts | undefined): [string, string][] {
  if (!inst.params.runtime.kvm || !facts) return [];
  const access = kvmAccess(facts.kvm);
  return access.kind === "group" ? [["PodmanArgs", `--group-add ${access.gid}`]] : [];
}

function renderExporter(
  inst: Instance,
  header: string[],
  d: QuadletDialect,
  facts: HostFacts | undefined,
): string {
  const runtime = `${inst.name}-runtime`;
  return unit([
    ["Unit", [
      ["Description", `Jumpstarter exporter ${inst.namespace}/${inst.name} (set ${inst.setName})`],
      // BindsTo: when the runtime stops, its network namespace is gone, so the exporter must go with it (and
      // systemd restarts it along with the runtime). `Network=<unit>.container` adds Requires/After as well;
      // `container:<name>` is only a name to quadlet, so there the ordering is all ours.
      ...(d.network === "container" ? [["Requires", `${runtime}.service`] as [string, string]] : []),
      ["BindsTo", `${runtime}.service`],
      ["After", `${runtime}.service`],
    ]],
    ["Container", [
      ...commonContainerKeys(inst, "exporter", d),
      // The runtime's network namespace: the tcp driver's 127.0.0.1:2222 is QEMU's ssh forward of this instance
      // only, and any number of instances on one host each have their own 2222. The runtime's ContainerName is
      // `<name>-runtime` (commonContainerKeys).
      ["Network", d.network === "unit" ? `${runtime}.container` : `container:${runtime}`],
      ["Volume", `${configMountDir(inst.name)}:${CONFIG_DIR}:ro,z`],
      // non-root whatever the image says; the config and the shared volume are this uid's
      ["User", String(EXPORTER_UID)],
      ["Group", String(EXPORTER_UID)],
      ...kvmGroupKeys(inst, facts),
      ["Environment", `JUMPSTARTER_LAUNCHER_SOCKET=${LAUNCHER_SOCKET}`],
      ["Exec", `jmp run --exporter-config ${configPath(inst.name)}`],
    ]],
    // ExitAndReplace: the exporter exits cleanly when its lease ends and must stay down until the controller
    // replaces the instance; only a crash is restarted. InPlaceReuse: it always comes back.
    service(inst.exitOnLeaseEnd ? "on-failure" : "always"),
    install,
  ], header);
}
