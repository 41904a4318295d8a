/**
 * Where a set runs and where an Exporter was deployed: the one place that turns a class, a set and their Secrets
 * into an SSH target, and that writes and reads the `ssh-target` annotation. Used by reconcile, teardown, the orphan
 * sweep and `doctor`. Pure.
 */
import type { Exporter, ExporterSet, Secret, VirtualTargetClass } from "../api/types.ts";
import type { InstanceParams } from "../host/instance_params.ts";
import { type FieldError, type Placement, type PoolHost, resolveParams } from "./params.ts";
import { hostKey } from "./placement.ts";
import { type LabTarget, PINNED_HOST_KEYS_SECRET, recordedTarget, sshTarget } from "./credentials.ts";
import type { Caches } from "./context.ts";
import type { Problem } from "./status.ts";
import { HOST_ANNOTATION, RECLAIM_ANNOTATION } from "./marks.ts";

/** Where an instance was deployed (user@host:port), so teardown finds it even after the set's host changed. */
export const TARGET_ANNOTATION = "qemu-ssh.jumpstarter.dev/ssh-target";

/**
 * The Secret whose key deployed the instance, recorded with TARGET_ANNOTATION, so a teardown still finds the key when
 * the class that named the Secret went first (deployedTargets).
 */
export const CREDENTIALS_ANNOTATION = "qemu-ssh.jumpstarter.dev/ssh-credentials";

/**
 * The annotations that say where an instance goes (target and host), with which class's Secret and reclaim policy,
 * before anything reaches the host; null removes one. They come with the Exporter's create (writes.ts) and change
 * with a move (deploy.ts): no write of ours follows an apply (one PATCH per instance did, 4000 of the 10,000
 * requests converging 500 x 8, when the client's 50 qps bucket held that converge back by a fifth).
 */
export function targetAnnotations(where: string, cls: VirtualTargetClass | undefined): Record<string, string | null> {
  const secret = cls?.spec.credentialsSecretRef?.name;
  return {
    [TARGET_ANNOTATION]: where,
    [HOST_ANNOTATION]: TARGET_RE.exec(where)?.[2] ?? null,
    ...secret ? { [CREDENTIALS_ANNOTATION]: secret } : {},
    [RECLAIM_ANNOTATION]: cls?.spec.reclaimPolicy === "Retain" ? "Retain" : null,
  };
}

/** The form of TARGET_ANNOTATION: user@host:port. */
const TARGET_RE = /^(.+)@(.+):(\d+)$/;

export const targetString = (t: Pick<LabTarget, "user" | "host" | "port">) => `${t.user}@${t.host}:${t.port}`;

/**
 * Whether two targets name the same sshd: host names compare as DNS does (case-insensitive; params.ts refuses a
 * trailing dot) and the user does not count (root or ops with sudo reach the same machine). A name and an address of
 * the same machine still differ: telling that would need DNS at reconcile time, which is neither pure nor proof of
 * identity (the host key would be, but a move is decided before connecting).
 */
export function sameHost(a: Pick<LabTarget, "host" | "port">, b: Pick<LabTarget, "host" | "port">): boolean {
  return a.port === b.port && a.host.toLowerCase() === b.host.toLowerCase();
}

/** The target an annotation names, with the credentials of `like`; `like` itself if the annotation is malformed. */
export function parseTarget(s: string, like: LabTarget): LabTarget {
  const m = TARGET_RE.exec(s);
  return m ? { ...like, user: m[1], host: m[2], port: Number(m[3]) } : like;
}

/** The user, host and port an Exporter's target annotation names; undefined if it has none (or a malformed one). */
export function annotatedTarget(e: Exporter): Pick<LabTarget, "user" | "host" | "port"> | undefined {
  const m = TARGET_RE.exec(e.metadata.annotations?.[TARGET_ANNOTATION] ?? "");
  return m ? { user: m[1], host: m[2], port: Number(m[3]) } : undefined;
}

/** A Secret of the class's namespace by name. */
export type SecretLookup = (name: string) => Secret | undefined;

/** One host of a set's placement: its instances' parameters (its own user, port and arch) and its SSH target. */
export interface HostTarget {
  /** placement.ts hostKey */
  key: string;
  host: PoolHost;
  params: InstanceParams;
  target: LabTarget;
}

export type SetTarget =
  | { ok: false; stage: "parameters"; errors: FieldError[] }
  | { ok: false; stage: "credentials"; params: InstanceParams; warnings: string[]; problem: Problem }
  | {
    ok: true;
    /** Those of the first host; each host's own are in `hosts`. */
    params: InstanceParams;
    warnings: string[];
    target: LabTarget;
    tofu: boolean;
    placement: Placement;
    hosts: HostTarget[];
  };

/** The parameters and SSH targets of a set of the class, or the stage that keeps it from having them and why. */
export function setTarget(cls: VirtualTargetClass, set: ExporterSet, secret: SecretLookup): SetTarget {
  const resolved = resolveParams(cls, set);
  if (!resolved.ok) return { ok: false, stage: "parameters", errors: resolved.errors };
  const { params, warnings, placement } = resolved;
  const hosts: HostTarget[] = [];
  let tofu = false;
  for (const host of placement.hosts) {
    const own: InstanceParams = { ...params, host: { name: host.name, user: host.user, port: host.port } };
    if (host.arch) own.arch = host.arch;
    const cred = credentials(cls, own, secret);
    if (!cred.ok) return { ok: false, stage: "credentials", params, warnings, problem: cred.problem };
    tofu ||= cred.tofu;
    hosts.push({ key: hostKey(host.name, host.port), host, params: own, target: cred.target });
  }
  return { ok: true, params, warnings, target: hosts[0].target, tofu, placement, hosts };
}

const cachedSecrets = (caches: Pick<Caches, "secrets">, ns: string | undefined): SecretLookup => (name) =>
  caches.secrets.get(ns, name);

/** The class's credentials (and the host keys pinned in its namespace) for a host. */
const credentials = (cls: VirtualTargetClass, params: InstanceParams, secret: SecretLookup) =>
  sshTarget(cls, params, secret(cls.spec.credentialsSecretRef?.name ?? ""), secret(PINNED_HOST_KEYS_SECRET));

/** setTarget on the cached Secrets. */
export const cachedSetTarget = (caches: Pick<Caches, "secrets">, cls: VirtualTargetClass, set: ExporterSet) =>
  setTarget(cls, set, cachedSecrets(caches, set.metadata.namespace));

/**
 * The SSH target an Exporter was deployed to (its target annotation), once with the credentials of each class of ours
 * in its namespace that has usable ones: first the classes whose own parameters name that target, as only the host
 * can tell which key it accepts; last the Secret it recorded (CREDENTIALS_ANNOTATION), if it is still there. Empty if
 * it was never deployed or none of these has usable credentials.
 */
export function deployedTargets(
  caches: Pick<Caches, "classes" | "secrets">,
  provisioner: string,
  e: Exporter,
): LabTarget[] {
  const ns = e.metadata.namespace!;
  const where = e.metadata.annotations?.[TARGET_ANNOTATION] ?? "";
  const m = TARGET_RE.exec(where);
  if (!m) return [];
  const params = { host: { name: m[2], user: m[1], port: Number(m[3]) } } as InstanceParams;
  const secret = cachedSecrets(caches, ns);
  const bareSet = (cls: VirtualTargetClass): ExporterSet => ({
    metadata: { namespace: ns },
    spec: { virtualTargetClassName: cls.metadata.name! },
  });
  const names = (cls: VirtualTargetClass) => {
    const own = setTarget(cls, bareSet(cls), secret);
    return own.ok && targetString(own.target) === where;
  };
  const ranked = caches.classes.list(ns).filter((cls) => cls.spec.provisioner === provisioner)
    .sort((a, b) => Number(names(b)) - Number(names(a)));
  const byClass = ranked.flatMap((cls) => {
    const cred = credentials(cls, params, secret);
    return cred.ok ? [cred.target] : [];
  });
  const recorded = e.metadata.annotations?.[CREDENTIALS_ANNOTATION];
  const fallback = recorded
    ? recordedTarget(
      ns,
      { host: m[2], user: m[1], port: Number(m[3]) },
      secret(recorded),
      secret(PINNED_HOST_KEYS_SECRET),
    )
    : undefined;
  return fallback ? [...byClass, fallback] : byClass;
}

/**
 * Every distinct lab host that some ExporterSet of ours points at, or some Exporter was deployed to (a set that
 * moved or went may have left instances behind), with working credentials.
 */
export function hostTargets(caches: Caches, provisioner: string): LabTarget[] {
  const out = new Map<string, LabTarget>();
  for (const e of caches.exporters.list()) {
    const [target] = deployedTargets(caches, provisioner, e);
    if (target) out.set(targetString(target), target);
  }
  for (const set of caches.sets.list()) {
    const cls = caches.classes.get(set.metadata.namespace, set.spec.virtualTargetClassName);
    if (!cls || cls.spec.provisioner !== provisioner) continue;
    const resolved = cachedSetTarget(caches, cls, set);
    if (resolved.ok) { for (const h of resolved.hosts) out.set(targetString(h.target), h.target); }
  }
  return [...out.values()];
}
