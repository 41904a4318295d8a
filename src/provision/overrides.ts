/**
 * What a VirtualTargetClass lets its ExporterSets override (`spec.setOverrides`). The fields that decide who logs in
 * where and what reaches the root runtime container (host, user, port, devices, host-key checking) are the class's,
 * as a StorageClass's are its admin's: a set author may change them only where the class allows it. Everything else
 * in `parameters` (arch, resources, storage, runtime.kvm) stays free. Pure.
 */
import type { SetOverrides, VirtualTargetClass } from "../api/types.ts";
import type { HostKeyPolicy } from "../host/ssh.ts";
import type { FieldError } from "./params.ts";

/**
 * The policy of a class that says nothing: sets may choose their host (the seed's "create additional ExporterSets
 * ... that override parameters.host", one set per host), nothing else.
 */
export const SET_OVERRIDE_DEFAULTS = { host: true, user: false, port: false, devices: [] as string[] } as const;

/** A device pattern: a path under /dev where `*` and `?` stand for characters within one path segment. */
const DEVICE_GLOB_RE = /^\/dev\/[A-Za-z0-9_.+*?-]+(?:\/[A-Za-z0-9_.+*?-]+)*$/;

const validPattern = (p: unknown): p is string =>
  typeof p === "string" && DEVICE_GLOB_RE.test(p) && !p.split("/").some((s) => s === "." || s === "..");

/** The class's rules, defaults filled in (a `true` only counts as true: a manifest file may hold anything). */
export function overridePolicy(cls: VirtualTargetClass): Required<SetOverrides> {
  const o = cls.spec.setOverrides ?? {};
  return {
    host: o.host === undefined ? SET_OVERRIDE_DEFAULTS.host : o.host === true,
    user: o.user === true,
    port: o.port === true,
    devices: Array.isArray(o.devices) ? o.devices : [...SET_OVERRIDE_DEFAULTS.devices],
  };
}

/** Whether a host device path matches a pattern of the allow-list. */
export function deviceAllowed(path: string, pattern: string): boolean {
  const re = pattern.replace(/[.+]/g, "\\$&").replaceAll("*", "[^/]*").replaceAll("?", "[^/]");
  return new RegExp(`^${re}$`).test(path);
}

/** The values a set ended up with, beside what the class alone gives (undefined: the class does not set it). */
export interface Chosen {
  /** Whether the set writes the field at all: only a set's own value can break the class's rule. */
  bySet: (path: string[]) => boolean;
  host: { set?: string; cls?: string };
  /** `parameters.hosts` as JSON, in effect and on the class alone; with the user and port each entry gives. */
  hosts: { set?: string; cls?: string; entries: { user?: unknown; port?: unknown }[] };
  user: { set: string; cls: string };
  port: { set: number; cls: number };
  /** Host sides ("/dev/x" of "/dev/x:/dev/y") of the set's devices, and of the class's own. */
  devices: { set: string[]; cls: string[] };
  hostKeyPolicy: { set?: HostKeyPolicy; cls?: HostKeyPolicy };
}

/**
 * The errors of a set that overrides what its class keeps, and of a malformed allow-list on the class. Restating the
 * class's own value is no override. A host-key policy can only be made stricter: Strict always, AcceptNew only where
 * the class says AcceptNew itself (a class that says nothing is Strict when its Secret carries known_hosts, and a set
 * cannot loosen that; see credentials.ts).
 */
export function overrideErrors(cls: VirtualTargetClass, set: string, c: Chosen): FieldError[] {
  const policy = overridePolicy(cls);
  const clsName = cls.metadata.name ?? "";
  const errors: FieldError[] = [];
  const rule = `VirtualTargetClass ${clsName}`;
  const refuse = (path: string[], message: string) =>
    errors.push({ object: "ExporterSet", name: set, field: `spec.parameters.${path.join(".")}`, message });
  const firstBySet = (...paths: string[][]) => paths.find(c.bySet) ?? paths[0];

  (policy.devices as unknown[]).forEach((p, i) => {
    if (!validPattern(p)) {
      errors.push({
        object: "VirtualTargetClass",
        name: clsName,
        field: `spec.setOverrides.devices[${i}]`,
        message: `${JSON.stringify(p)} is not a device pattern: use an absolute path under /dev where * and ? match ` +
          `within one path segment, e.g. "/dev/ttyUSB*"`,
      });
    }
  });

  if (!policy.host && c.bySet(["host", "name"]) && c.host.set !== c.host.cls) {
    refuse(
      ["host", "name"],
      `${rule} does not let its sets choose the host (spec.setOverrides.host is false)` +
        (c.host.cls ? `; its host is ${c.host.cls}` : "") +
        ": remove host.name from the set, or ask the lab admin to allow it on the class",
    );
  }
  if (!policy.host && c.bySet(["hosts"]) && c.hosts.set !== c.hosts.cls) {
    refuse(
      ["hosts"],
      `${rule} does not let its sets choose the host (spec.setOverrides.host is false), and a pool of hosts is a ` +
        "choice of hosts: remove hosts from the set, or ask the lab admin to allow it on the class",
    );
  }
  if (c.bySet(["hosts"]) && c.hosts.set !== c.hosts.cls) {
    c.hosts.entries.forEach((h, i) => {
      if (!policy.user && h.user !== undefined && h.user !== c.user.cls) {
        refuse(
          [`hosts[${i}]`, "user"],
          `${rule} does not let its sets choose the SSH user (spec.setOverrides.user is false); it logs in as ` +
            `${c.user.cls}: remove user from this host, or ask the lab admin to allow it on the class`,
        );
      }
      if (!policy.port && h.port !== undefined && h.port !== c.port.cls) {
        refuse(
          [`hosts[${i}]`, "port"],
          `${rule} does not let its sets choose the SSH port (spec.setOverrides.port is false); it uses port ` +
            `${c.port.cls}: remove port from this host, or ask the lab admin to allow it on the class`,
        );
      }
    });
  }
  const userPaths = [["host", "user"], ["ssh", "user"]];
  if (!policy.user && userPaths.some(c.bySet) && c.user.set !== c.user.cls) {
    refuse(
      firstBySet(...userPaths),
      `${rule} does not let its sets choose the SSH user (spec.setOverrides.user is false); it logs in as ` +
        `${c.user.cls}: remove the user from the set, or ask the lab admin to allow it on the class`,
    );
  }
  const portPaths = [["host", "port"], ["ssh", "port"]];
  if (!policy.port && portPaths.some(c.bySet) && c.port.set !== c.port.cls) {
    refuse(
      firstBySet(...portPaths),
      `${rule} does not let its sets choose the SSH port (spec.setOverrides.port is false); it uses port ` +
        `${c.port.cls}: remove the port from the set, or ask the lab admin to allow it on the class`,
    );
  }
  if (c.bySet(["runtime", "devices"])) {
    c.devices.set.forEach((d, i) => {
      if (c.devices.cls.includes(d) || policy.devices.filter(validPattern).some((p) => deviceAllowed(d, p))) return;
      const allowed = policy.devices.length ? `allows only ${policy.devices.join(", ")}` : "allows none";
      errors.push({
        object: "ExporterSet",
        name: set,
        field: `spec.parameters.runtime.devices[${i}]`,
        message: `${d} is not a device ${rule} lets its sets pass to the runtime container ` +
          `(spec.setOverrides.devices ${allowed}): remove it from the set, or ask the lab admin to add it there`,
      });
    });
  }
  if (c.bySet(["ssh", "hostKeyPolicy"]) && c.hostKeyPolicy.set === "AcceptNew" && c.hostKeyPolicy.cls === "Strict") {
    refuse(
      ["ssh", "hostKeyPolicy"],
      `${rule} checks host keys Strict, and a set can only make host-key checking stricter: remove ` +
        "ssh.hostKeyPolicy from the set",
    );
  }
  return errors;
}
