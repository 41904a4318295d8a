/**
 * Provisioner parameters: the class's `spec.parameters` with the set's deep-merged over them where the class's
 * `spec.setOverrides` allows it (overrides.ts), validated into the typed values the renderer and the remote scripts
 * use. Everything validated here ends up on a remote host (an SSH target, a unit file, a container argument), so this
 * is the injection boundary: values are checked against strict patterns, never escaped into shape. Pure: no I/O, no
 * clock.
 */
import { isIPv4, isIPv6 } from "node:net";
import type { DriverSpec, ExporterSet, VirtualTargetClass } from "../api/types.ts";
import type { HostKeyPolicy } from "../host/ssh.ts";
import {
  DEFAULT_FS_OVERHEAD,
  DEFAULT_STORAGE_SIZE,
  diskVolumeBytes,
  type ImageChoice,
  type InstanceParams,
  overheadBytes,
  QEMU_DRIVER_TYPE,
  quantityBytes,
} from "../host/instance_params.ts";
import { overrideErrors } from "./overrides.ts";
import { parseDuration } from "./plan.ts";

export interface FieldError {
  object: "VirtualTargetClass" | "ExporterSet";
  name: string;
  /** Path from the object's root, e.g. `spec.parameters.host.name`. */
  field: string;
  /** What is wrong and how to fix it. */
  message: string;
}

/** One line per error, as status messages, events and the CLI show them. */
export const fieldErrorLine = (e: FieldError) => `${e.object} ${e.name}: ${e.field}: ${e.message}`;

/** One lab host of the set's pool, with the overrides of its `parameters.hosts` entry applied. */
export interface PoolHost {
  name: string;
  user: string;
  port: number;
  /** Instances of the set it takes at most; undefined: no bound of its own (host.name, or no slots given). */
  slots?: number;
  arch?: string;
}

/** Where the set's instances may go: one host (host.name) or a pool (hosts), and when a silent host is failed over. */
export interface Placement {
  hosts: PoolHost[];
  /** From parameters.hosts: instances are placed per host and failed over; host.name keeps one host as before. */
  pooled: boolean;
  failoverMs: number;
}

export const DEFAULT_HOST_FAILURE_TIMEOUT = "2m";
const MAX_SLOTS = 1024;
const MAX_POOL = 256;

export type ResolveResult =
  | { ok: true; params: InstanceParams; placement: Placement; warnings: string[] }
  | { ok: false; errors: FieldError[] };

export const DEFAULT_IMAGES = {
  exporter: "quay.io/jumpstarter-dev/jumpstarter:latest",
  runtime: "quay.io/jumpstarter-dev/virtual/qemu-runtime:latest",
} as const;

export const KNOWN_ARCHES = [
  "x86_64",
  "i386",
  "aarch64",
  "arm",
  "riscv64",
  "riscv32",
  "ppc64le",
  "ppc64",
  "ppc",
  "s390x",
  "mips64el",
  "mips64",
  "mipsel",
  "mips",
  "loongarch64",
] as const;

type Json = Record<string, unknown>;

const isMap = (v: unknown): v is Json => typeof v === "object" && v !== null && !Array.isArray(v);

/** Deep merge as upstream does it for `ExporterSet.spec.parameters`: maps merge recursively, anything else replaces. */
export function mergeParameters(base: Json | undefined, override: Json | undefined): Json {
  const out: Json = { ...base };
  for (const [k, v] of Object.entries(override ?? {})) {
    const b = out[k];
    out[k] = isMap(b) && isMap(v) ? mergeParameters(b, v) : v;
  }
  return out;
}

// ---------------------------------------------------------------- value checks

const DNS_LABEL = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?";
const DNS_NAME_RE = new RegExp(`^${DNS_LABEL}(?:\\.${DNS_LABEL})*$`);
const USER_RE = /^[a-z_][a-z0-9_.-]{0,31}$/;
const DEV_PATH = "/dev/[A-Za-z0-9_.+-]+(?:/[A-Za-z0-9_.+-]+)*";
const DEVICE_RE = new RegExp(`^${DEV_PATH}(?::${DEV_PATH})?$`);
// The distribution reference grammar, restricted to what a unit file and podman accept without quoting.
const REF_COMPONENT = "[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*";
const IMAGE_RE = new RegExp(
  `^(?:${DNS_LABEL}(?:\\.${DNS_LABEL})*(?::[0-9]{1,5})?/)?${REF_COMPONENT}(?:/${REF_COMPONENT})*` +
    `(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$`,
);
const MAX_MEMORY = 4 * 2 ** 40;
const MAX_STORAGE = 64 * 2 ** 40;
const MIN_SIZE = 2 ** 20;
const MAX_DEVICES = 64;

/** The parameters we understand; anything else is reported as a warning so that typos are visible. */
const KNOWN: Record<string, Record<string, true> | true> = {
  ssh: { user: true, port: true, hostKeyPolicy: true },
  host: { name: true, user: true, port: true },
  hosts: true,
  hostFailureTimeout: true,
  runtime: { kvm: true, devices: true, host_network: true },
  arch: true,
  resources: { cpu: true, memory: true },
  storage: { size: true, fsOverhead: true },
};

const typeName = (v: unknown) => v === null ? "null" : Array.isArray(v) ? "list" : typeof v;

/** Resolves and validates the parameters, images and driver template of one ExporterSet over its class. */
export function resolveParams(cls: VirtualTargetClass, set: ExporterSet): ResolveResult {
  const errors: FieldError[] = [];
  const warnings: string[] = [];
  const clsParams = cls.spec.parameters ?? {};
  const setParams = set.spec.parameters ?? {};
  const merged = mergeParameters(clsParams, setParams);
  const who = (o: VirtualTargetClass | ExporterSet, kind: FieldError["object"]) => ({
    object: kind,
    name: o.metadata.name ?? "",
  });
  const clsRef = who(cls, "VirtualTargetClass");
  const setRef = who(set, "ExporterSet");

  // Blame the object the merged value came from: the set if it sets this path, else the class.
  const origin = (path: string[]) => {
    let cur: unknown = setParams;
    for (const p of path) {
      if (!isMap(cur) || !(p in cur)) return clsRef;
      cur = cur[p];
    }
    return setRef;
  };
  // `suffix` addresses inside a list, which comes whole from one object since lists replace
  const fail = (path: string[], message: string, suffix = "") =>
    errors.push({ ...origin(path), field: `spec.parameters.${path.join(".")}${suffix}`, message });

  const get = (path: string[]) => valueAt(merged, path);

  // Unknown keys, reported on each object separately so the message names where the typo is.
  for (const [ref, params] of [[clsRef, clsParams], [setRef, setParams]] as const) {
    for (const [k, v] of Object.entries(params)) {
      const known = Object.hasOwn(KNOWN, k) ? KNOWN[k] : undefined;
      if (known === undefined) {
        warnings.push(unknownKey(ref, [k], Object.keys(KNOWN)));
      } else if (known !== true && isMap(v)) {
        for (const sub of Object.keys(v)) {
          if (!Object.hasOwn(known, sub)) warnings.push(unknownKey(ref, [k, sub], Object.keys(known)));
        }
      }
    }
  }
  for (const section of Object.keys(KNOWN)) {
    const v = merged[section];
    const known = KNOWN[section];
    if (known !== true && v !== undefined && !isMap(v)) {
      fail([section], `expected a map with the keys ${Object.keys(known).join(", ")}; got ${typeName(v)}`);
    }
  }
  if (get(["runtime", "host_network"]) !== undefined) {
    warnings.push(
      `${describe(origin(["runtime", "host_network"]))}: spec.parameters.runtime.host_network is ignored: the ` +
        "exporter always shares the runtime's own network namespace, so instances on one host never clash",
    );
  }

  const str = (path: string[], check: (s: string) => string | undefined): string | undefined => {
    const v = get(path);
    if (v === undefined) return undefined;
    if (typeof v !== "string") {
      fail(path, `expected a string, got ${typeName(v)} ${JSON.stringify(v)}`);
      return undefined;
    }
    const problem = check(v);
    if (problem) {
      fail(path, problem);
      return undefined;
    }
    return v;
  };
  const int = (path: string[], min: number, max: number): number | undefined => {
    const v = get(path);
    if (v === undefined) return undefined;
    if (typeof v === "string" && /^[0-9]+$/.test(v)) {
      fail(path, `expected an integer, got the string "${v}": write ${v} without quotes`);
    } else if (typeof v !== "number" || !Number.isInteger(v)) {
      fail(path, `expected an integer from ${min} to ${max}, got ${typeName(v)} ${JSON.stringify(v)}`);
    } else if (v < min || v > max) {
      fail(path, `${v} is out of range: use an integer from ${min} to ${max}`);
    } else return v;
    return undefined;
  };

  // host: where the instances run and how to log in
  const hostName = str(["host", "name"], checkHostName);
  const hostsGiven = get(["hosts"]) !== undefined;
  if (hostsGiven && get(["host", "name"]) !== undefined) {
    const [a, b] = [origin(["host", "name"]), origin(["hosts"])];
    errors.push({
      ...b,
      field: "spec.parameters.hosts",
      message: `give either host.name (one lab host) or hosts (a pool), not both: host.name comes from ` +
        `${describe(a)} and hosts from ${describe(b)}; remove one of them`,
    });
  }
  if (!hostsGiven && get(["host", "name"]) === undefined && (merged.host === undefined || isMap(merged.host))) {
    errors.push({
      ...clsRef,
      field: "spec.parameters.host.name",
      message: "missing: set parameters.host.name (the lab host's DNS name or IP address) or parameters.hosts " +
        `(a pool of them) on the VirtualTargetClass ${clsRef.name} or on the ExporterSet ${setRef.name}`,
    });
  }
  const userCheck = (s: string) =>
    USER_RE.test(s)
      ? undefined
      : `${JSON.stringify(s)} is not a valid user name: use lowercase letters, digits, "_", "." or "-" ` +
        "(starting with a letter or _), at most 32 characters";
  // both levels are checked even when host.* wins: another set of the same class may use ssh.*
  const sshUser = str(["ssh", "user"], userCheck);
  const sshPort = int(["ssh", "port"], 1, 65535);
  const user = str(["host", "user"], userCheck) ?? sshUser ?? "root";
  const port = int(["host", "port"], 1, 65535) ?? sshPort ?? 22;
  const hostKeyPolicy = str(
    ["ssh", "hostKeyPolicy"],
    (s) =>
      s === "Strict" || s === "AcceptNew"
        ? undefined
        : `${JSON.stringify(s)} is not a host key policy: use Strict or AcceptNew`,
  ) as HostKeyPolicy | undefined;

  // runtime
  let kvm = false;
  const kvmValue = get(["runtime", "kvm"]);
  if (kvmValue !== undefined && typeof kvmValue !== "boolean") {
    fail(["runtime", "kvm"], `expected true or false, got ${typeName(kvmValue)} ${JSON.stringify(kvmValue)}`);
  } else kvm = kvmValue === true;
  const devices = checkDevices(get(["runtime", "devices"]), (m, suffix) => fail(["runtime", "devices"], m, suffix));

  // what the class lets its sets override (overrides.ts), judged on the values in effect
  const clsGet = (path: string[]) => valueAt(clsParams, path);
  const asString = (v: unknown) => typeof v === "string" ? v : undefined;
  const asInt = (v: unknown) => Number.isInteger(v) ? v as number : undefined;
  const hostSides = (v: unknown) =>
    Array.isArray(v) ? v.filter((d): d is string => typeof d === "string").map((d) => d.split(":")[0]) : [];
  const bySet = (path: string[]) => origin(path) === setRef;
  const clsPolicy = asString(clsGet(["ssh", "hostKeyPolicy"])) as HostKeyPolicy | undefined;
  errors.push(...overrideErrors(cls, setRef.name, {
    bySet,
    host: { set: hostName, cls: asString(clsGet(["host", "name"])) },
    hosts: {
      set: JSON.stringify(get(["hosts"])),
      cls: JSON.stringify(clsGet(["hosts"])),
      entries: (Array.isArray(get(["hosts"])) ? get(["hosts"]) as unknown[] : []).map((h) => isMap(h) ? h : {}),
    },
    user: {
      set: user,
      cls: asString(clsGet(["host", "user"])) ?? asString(clsGet(["ssh", "user"])) ?? "root",
    },
    port: { set: port, cls: asInt(clsGet(["host", "port"])) ?? asInt(clsGet(["ssh", "port"])) ?? 22 },
    devices: { set: hostSides(devices), cls: hostSides(clsGet(["runtime", "devices"])) },
    hostKeyPolicy: { set: hostKeyPolicy, cls: clsPolicy },
  }));
  // a set's AcceptNew never loosens the class: where the class says nothing, its Secret decides (credentials.ts)
  const keyPolicy = bySet(["ssh", "hostKeyPolicy"]) && hostKeyPolicy === "AcceptNew" && clsPolicy !== "AcceptNew"
    ? undefined
    : hostKeyPolicy;

  const arch = str(
    ["arch"],
    (s) =>
      (KNOWN_ARCHES as readonly string[]).includes(s)
        ? undefined
        : `${JSON.stringify(s)} is not a known QEMU architecture: use one of ${KNOWN_ARCHES.join(", ")}`,
  );
  const pool = checkPool(get(["hosts"]), { user, port }, (m, suffix) => fail(["hosts"], m, suffix), userCheck);
  const failoverText = str(["hostFailureTimeout"], checkFailureTimeout) ?? DEFAULT_HOST_FAILURE_TIMEOUT;
  const cpu = int(["resources", "cpu"], 1, 1024);
  const memory = str(["resources", "memory"], (s) => checkQuantity(s, MAX_MEMORY, "4Ti"));
  const storage = str(["storage", "size"], (s) => checkQuantity(s, MAX_STORAGE, "64Ti"));
  const overhead = str(["storage", "fsOverhead"], checkOverhead);

  const images = {
    exporter: resolveImage("exporter", cls, set, clsRef, setRef, errors),
    runtime: resolveImage("runtime", cls, set, clsRef, setRef, errors),
  };
  checkDrivers(set.spec.template?.spec?.drivers, setRef, errors, warnings);

  const hosts = pool ?? (hostName === undefined ? undefined : [{ name: hostName, user, port }]);
  if (errors.length > 0 || hosts === undefined) return { ok: false, errors };
  const [first] = hosts;
  const params: InstanceParams = {
    host: { name: first.name, user: first.user, port: first.port },
    runtime: { kvm, devices },
    diskBytes: diskVolumeBytes(storage ?? DEFAULT_STORAGE_SIZE, overhead ?? DEFAULT_FS_OVERHEAD),
    images,
  };
  if (keyPolicy) params.hostKeyPolicy = keyPolicy;
  if (arch) params.arch = arch;
  if (cpu !== undefined) params.cpu = cpu;
  if (memory) params.memory = memory;
  if (storage) params.storage = storage;
  const placement = { hosts, pooled: pool !== undefined, failoverMs: parseDuration(failoverText) };
  return { ok: true, params, placement, warnings };
}

function valueAt(root: unknown, path: string[]): unknown {
  let cur = root;
  for (const p of path) cur = isMap(cur) ? cur[p] : undefined;
  return cur;
}

type Ref = { object: FieldError["object"]; name: string };

const describe = (ref: Ref) => `${ref.object} ${ref.name}`;

function unknownKey(ref: Ref, path: string[], known: string[]): string {
  const key = path[path.length - 1];
  const near = known.find((k) => editDistance(k, key) <= 2);
  const shown = path.map((k) => /^[A-Za-z0-9_-]+$/.test(k) ? k : JSON.stringify(k)).join(".");
  return `${describe(ref)}: spec.parameters.${shown} is not a known parameter and is ignored` +
    (near ? ` (did you mean ${[...path.slice(0, -1), near].join(".")}?)` : ` (known here: ${known.join(", ")})`);
}

function editDistance(a: string, b: string): number {
  let prev = Array.from({ length: b.length + 1 }, (_, i) => i);
  for (let i = 1; i <= a.length; i++) {
    const cur = [i];
    for (let j = 1; j <= b.length; j++) {
      cur[j] = Math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] === b[j - 1] ? 0 : 1));
    }
    prev = cur;
  }
  return prev[b.length];
}

function checkHostName(s: string): string | undefined {
  if (isIPv4(s) || isIPv6(s)) return undefined;
  if (/^\[.*\]$/.test(s) && isIPv6(s.slice(1, -1))) return `write the IPv6 address without brackets: ${s.slice(1, -1)}`;
  if (s.length <= 253 && DNS_NAME_RE.test(s) && !/^[0-9.]+$/.test(s)) return undefined;
  return `${JSON.stringify(s)} is not a DNS name or an IP address: use a host name like lab-host-01.example.com, ` +
    "an IPv4 address like 10.0.0.5 or an IPv6 address like fd00::5 (no port, user or brackets)";
}

/** `parameters.hosts`: a non-empty list of {name, user?, port?, slots?, arch?}, each host:port once. */
function checkPool(
  v: unknown,
  defaults: { user: string; port: number },
  fail: (message: string, suffix?: string) => void,
  userCheck: (s: string) => string | undefined,
): PoolHost[] | undefined {
  if (v === undefined) return undefined;
  const example = `e.g. [{name: lab-a.example.com, slots: 4}, {name: lab-b.example.com, port: 2222}]`;
  if (!Array.isArray(v) || v.length === 0) {
    fail(`expected a non-empty list of hosts, ${example}; got ${Array.isArray(v) ? "an empty list" : typeName(v)}`);
    return undefined;
  }
  if (v.length > MAX_POOL) fail(`${v.length} hosts is more than the maximum of ${MAX_POOL}`);
  const keys = ["name", "user", "port", "slots", "arch"];
  const out: PoolHost[] = [];
  let bad = false;
  v.forEach((h, i) => {
    const at = (k: string) => `[${i}].${k}`;
    const problem = (message: string, suffix: string) => {
      bad = true;
      fail(message, suffix);
    };
    if (!isMap(h)) return problem(`expected a map with the keys ${keys.join(", ")}; got ${typeName(h)}`, `[${i}]`);
    for (const k of Object.keys(h)) {
      if (!keys.includes(k)) problem(`${JSON.stringify(k)} is not a key of a pool host: use ${keys.join(", ")}`, at(k));
    }
    const name = typeof h.name === "string" ? h.name : undefined;
    const nameProblem = name === undefined
      ? `missing or not a string: give the lab host's DNS name or IP address`
      : checkHostName(name);
    if (nameProblem) problem(nameProblem, at("name"));
    const user = h.user === undefined ? defaults.user : h.user;
    const userProblem = typeof user === "string" ? userCheck(user) : `expected a string, got ${typeName(user)}`;
    if (userProblem) problem(userProblem, at("user"));
    const intIn = (k: string, min: number, max: number) => {
      const n = h[k];
      if (n === undefined || (Number.isInteger(n) && (n as number) >= min && (n as number) <= max)) return;
      problem(`expected an integer from ${min} to ${max}, got ${typeName(n)} ${JSON.stringify(n)}`, at(k));
    };
    intIn("port", 1, 65535);
    intIn("slots", 1, MAX_SLOTS);
    if (h.arch !== undefined && !(KNOWN_ARCHES as readonly unknown[]).includes(h.arch)) {
      problem(
        `${JSON.stringify(h.arch)} is not a known QEMU architecture: use one of ${KNOWN_ARCHES.join(", ")}`,
        at("arch"),
      );
    }
    if (bad) return;
    const host: PoolHost = { name: name!, user: user as string, port: (h.port as number) ?? defaults.port };
    if (h.slots !== undefined) host.slots = h.slots as number;
    if (h.arch !== undefined) host.arch = h.arch as string;
    const twin = out.findIndex((o) => o.port === host.port && o.name.toLowerCase() === host.name.toLowerCase());
    if (twin >= 0) {
      problem(`${host.name}:${host.port} is already in the pool at [${twin}]: list each host once`, `[${i}]`);
    }
    out.push(host);
  });
  return bad ? undefined : out;
}

function checkFailureTimeout(s: string): string | undefined {
  let ms: number;
  try {
    ms = parseDuration(s);
  } catch {
    return `${JSON.stringify(s)} is not a duration: use a Go duration like "2m", "90s" or "1m30s"`;
  }
  if (ms < 1_000) return `${JSON.stringify(s)} is less than 1s: a host is failed over after this much silence`;
  return undefined;
}

function checkQuantity(s: string, max: number, maxText: string): string | undefined {
  const bytes = quantityBytes(s);
  if (bytes === undefined) {
    return `${
      JSON.stringify(s)
    } is not a quantity: use an integer with an optional suffix Ki, Mi, Gi, Ti (or K, M, G, T), ` +
      `e.g. "4Gi" or "512Mi"`;
  }
  if (bytes < MIN_SIZE) {
    return `${JSON.stringify(s)} is less than 1Mi: did you forget the suffix, e.g. ${JSON.stringify(`${s}Gi`)}?`;
  }
  if (bytes > max) return `${JSON.stringify(s)} is more than the maximum of ${maxText}`;
  return undefined;
}

function checkOverhead(s: string): string | undefined {
  const bytes = overheadBytes(s, MAX_STORAGE);
  if (bytes === undefined) {
    return `${JSON.stringify(s)} is neither a percentage of storage.size (e.g. "10%", at most "100%") nor a ` +
      `quantity added to it (e.g. "1Gi")`;
  }
  if (s.endsWith("%")) return undefined;
  if (bytes > MAX_STORAGE) return `${JSON.stringify(s)} is more than the maximum of 64Ti`;
  if (bytes > 0 && bytes < MIN_SIZE) {
    return `${JSON.stringify(s)} is less than 1Mi: did you mean ${JSON.stringify(`${s}%`)} or ${
      JSON.stringify(`${s}Gi`)
    }?`;
  }
  return undefined;
}

function checkDevices(v: unknown, fail: (message: string, suffix?: string) => void): string[] {
  if (v === undefined) return [];
  if (!Array.isArray(v)) {
    fail(`expected a list of device paths like ["/dev/ttyUSB0"], got ${typeName(v)}`);
    return [];
  }
  if (v.length > MAX_DEVICES) fail(`${v.length} devices is more than the maximum of ${MAX_DEVICES}`);
  const ok: string[] = [];
  v.forEach((d, i) => {
    if (typeof d !== "string") {
      fail(`expected a device path string, got ${typeName(d)}`, `[${i}]`);
    } else if (!DEVICE_RE.test(d) || d.split(/[/:]/).some((seg) => seg === "." || seg === "..")) {
      fail(
        `${
          JSON.stringify(d)
        } is not a device path: use an absolute path under /dev made of letters, digits, "_", ".", "+", "-", ` +
          `optionally followed by ":/dev/name-in-container", e.g. "/dev/ttyUSB0" or "/dev/ttyUSB0:/dev/ttyS1"`,
        `[${i}]`,
      );
    } else ok.push(d);
  });
  return ok;
}

function resolveImage(
  role: "exporter" | "runtime",
  cls: VirtualTargetClass,
  set: ExporterSet,
  clsRef: Ref,
  setRef: Ref,
  errors: FieldError[],
): ImageChoice {
  const pick = <K extends "image" | "imagePullPolicy">(key: K) => {
    for (const [o, ref] of [[set, setRef], [cls, clsRef]] as const) {
      const v = o.spec.images?.[role]?.[key];
      if (v !== undefined) return { v: v as unknown, ref, field: `spec.images.${role}.${key}` };
    }
    return undefined;
  };
  const image = pick("image");
  const policy = pick("imagePullPolicy");
  const choice: ImageChoice = { image: DEFAULT_IMAGES[role], pullPolicy: "IfNotPresent" };
  if (image) {
    if (typeof image.v !== "string" || image.v.length > 512 || !IMAGE_RE.test(image.v)) {
      errors.push({
        ...image.ref,
        field: image.field,
        message:
          `${JSON.stringify(image.v)} is not an image reference: use [registry[:port]/]path[:tag][@sha256:digest] ` +
          `with lowercase path components, e.g. "${DEFAULT_IMAGES[role]}"`,
      });
    } else choice.image = image.v;
  }
  if (policy) {
    if (policy.v === "Always" || policy.v === "IfNotPresent" || policy.v === "Never") choice.pullPolicy = policy.v;
    else {
      errors.push({
        ...policy.ref,
        field: policy.field,
        message: `${JSON.stringify(policy.v)} is not a pull policy: use Always, IfNotPresent or Never`,
      });
    }
  }
  return choice;
}

/** Drivers the QEMU driver creates as its own children, by type, with their child names (upstream's qemudriver.go). */
const QEMU_CHILDREN = new Map([
  ["jumpstarter_driver_qemu.driver.QemuPower", "power"],
  ["jumpstarter_driver_qemu.driver.QemuFlasher", "flasher"],
]);

/**
 * The parts of the driver template the renderer relies on: names are config keys, the QEMU config is a map, and the
 * QEMU driver's own children are reached through refs.
 */
function checkDrivers(drivers: unknown, setRef: Ref, errors: FieldError[], warnings: string[]) {
  if (drivers === undefined) return;
  // the API server's schema guarantees the shape; manifest files (render, doctor) do not
  if (!Array.isArray(drivers)) {
    errors.push({
      ...setRef,
      field: "spec.template.spec.drivers",
      message: `expected a list, got ${typeName(drivers)}`,
    });
    return;
  }
  const seen = new Set<string>();
  drivers.forEach((d: DriverSpec, i) => {
    const field = `spec.template.spec.drivers[${i}]`;
    const err = (sub: string, message: string) => errors.push({ ...setRef, field: `${field}${sub}`, message });
    if (!isMap(d)) return err("", `expected a map with name and type or ref, got ${typeName(d)}`);
    if (typeof d.name !== "string") return err(".name", `expected a string, got ${typeName(d.name)}`);
    if (seen.has(d.name)) {
      err(".name", `driver name ${JSON.stringify(d.name)} is used twice: driver names must be unique`);
    }
    seen.add(d.name);
    if ((d.type === undefined) === (d.ref === undefined)) err("", "set exactly one of type or ref");
    if (typeof d.type === "string" && QEMU_CHILDREN.has(d.type)) {
      const qemu = drivers.find((o: DriverSpec) => isMap(o) && o.type === QEMU_DRIVER_TYPE)?.name ?? "<qemu>";
      const child = QEMU_CHILDREN.get(d.type)!;
      err(
        ".type",
        `${d.type} is part of the QEMU driver (${QEMU_DRIVER_TYPE} makes it as its child ${child}) and cannot ` +
          `stand alone; use a ref instead, e.g. {name: ${d.name}, ref: ${qemu}.${child}}`,
      );
    }
    if (d.config !== undefined && !isMap(d.config)) err(".config", `expected a map, got ${typeName(d.config)}`);
    if (d.type !== QEMU_DRIVER_TYPE || !isMap(d.config)) return;
    if ("launcher_socket" in d.config) {
      warnings.push(
        `${describe(setRef)}: ${field}.config.launcher_socket is replaced by /shared/launcher.sock, the socket of ` +
          "the runtime container",
      );
    }
    const fwd = d.config.hostfwd;
    if (fwd !== undefined && !isMap(fwd)) {
      err(".config.hostfwd", `expected a map of name: {protocol, hostaddr, hostport, guestport}, got ${typeName(fwd)}`);
    }
  });
}
