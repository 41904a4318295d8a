/**
 * An in-memory API server for unit tests of reconciling: create (generateName, uid), merge patch (resourceVersion
 * preconditions, the status subresource), delete (finalizers hold an object with a deletionTimestamp), and caches
 * that read the store directly, as informers that are always up to date.
 */
import type { KubeObject } from "../api/types.ts";
import { type KubeApi, KubeError, type Preconditions, type Resource } from "./client.ts";
import type { Cache } from "./informer.ts";

type Obj = KubeObject & Record<string, unknown>;

export class FakeKube implements KubeApi {
  private readonly store = new Map<string, Map<string, Obj>>();
  private version = 0;
  private uids = 0;
  /** Every write, in order: "create exporters ns/name", "patch ...", "delete ...". */
  readonly writes: string[] = [];

  constructor(private readonly now: () => Date = () => new Date()) {}

  /** A cache of one resource, reading the store as it is now. */
  cache<T extends KubeObject>(r: Resource): Cache<T> {
    return {
      get: (ns, name) => this.objects(r).get(key(ns, name)) as T | undefined,
      list: (ns) => [...this.objects(r).values()].filter((o) => ns === undefined || o.metadata.namespace === ns) as T[],
    };
  }

  /** Writes an object as someone else would (a user, Jumpstarter), with a fresh resourceVersion. */
  put<T extends KubeObject>(r: Resource, obj: T): T {
    const o = structuredClone(obj) as unknown as Obj;
    o.metadata.uid ??= `uid-${++this.uids}`;
    o.metadata.creationTimestamp ??= this.now().toISOString();
    o.metadata.resourceVersion = String(++this.version);
    this.objects(r).set(key(o.metadata.namespace, o.metadata.name!), o);
    return structuredClone(o) as unknown as T;
  }

  find<T>(r: Resource, namespace: string | undefined, name: string): Promise<T | undefined> {
    const o = this.objects(r).get(key(namespace, name));
    return Promise.resolve(o && structuredClone(o) as T);
  }

  create<T extends KubeObject>(r: Resource, obj: T): Promise<T> {
    const m = obj.metadata;
    const name = m.name ?? `${m.generateName}${(++this.uids).toString(36).padStart(5, "0")}`;
    if (this.objects(r).has(key(m.namespace, name))) {
      return Promise.reject(new KubeError(409, "AlreadyExists", `${r.plural} ${name} already exists`));
    }
    this.writes.push(`create ${r.plural} ${m.namespace}/${name}`);
    return Promise.resolve(this.put(r, { ...obj, metadata: { ...m, name, uid: undefined } }));
  }

  mergePatch<T>(r: Resource, namespace: string | undefined, name: string, patch: unknown, sub?: string): Promise<T> {
    const o = this.objects(r).get(key(namespace, name));
    if (!o) return Promise.reject(notFound(r, name));
    const p = patch as Partial<Obj>;
    const rv = p.metadata?.resourceVersion;
    if (rv !== undefined && rv !== o.metadata.resourceVersion) {
      return Promise.reject(new KubeError(409, "Conflict", `${r.plural} ${name}: resourceVersion ${rv} is stale`));
    }
    this.writes.push(`patch ${r.plural} ${namespace}/${name}${sub ? `/${sub}` : ""}`);
    // the status subresource takes only status; the object itself takes everything but status
    const { status, ...rest } = p;
    const next = mergeJson(o, sub === "status" ? { status } : rest) as Obj;
    if (next.metadata.deletionTimestamp && !next.metadata.finalizers?.length) {
      this.objects(r).delete(key(namespace, name));
      return Promise.resolve(structuredClone(next) as T);
    }
    return Promise.resolve(this.put(r, next) as T);
  }

  delete(r: Resource, namespace: string | undefined, name: string, preconditions?: Preconditions): Promise<void> {
    const o = this.objects(r).get(key(namespace, name));
    if (!o) return Promise.resolve();
    const { uid, resourceVersion } = preconditions ?? {};
    if ((uid && uid !== o.metadata.uid) || (resourceVersion && resourceVersion !== o.metadata.resourceVersion)) {
      return Promise.reject(new KubeError(409, "Conflict", `${r.plural} ${name}: precondition failed`));
    }
    this.writes.push(`delete ${r.plural} ${namespace}/${name}`);
    if (!o.metadata.finalizers?.length) this.objects(r).delete(key(namespace, name));
    else if (!o.metadata.deletionTimestamp) {
      this.put(r, { ...o, metadata: { ...o.metadata, deletionTimestamp: this.now().toISOString() } });
    }
    return Promise.resolve();
  }

  private objects(r: Resource): Map<string, Obj> {
    let m = this.store.get(r.plural);
    if (!m) this.store.set(r.plural, m = new Map());
    return m;
  }
}

const key = (ns: string | undefined, name: string) => `${ns ?? ""}/${name}`;

const notFound = (r: Resource, name: string) => new KubeError(404, "NotFound", `${r.plural} ${name} not found`);

const isMap = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);

/** RFC 7386. */
function mergeJson(target: unknown, patch: unknown): unknown {
  if (!isMap(patch)) return patch;
  const out: Record<string, unknown> = isMap(target) ? { ...target } : {};
  for (const [k, v] of Object.entries(patch)) {
    if (v === null) delete out[k];
    else out[k] = mergeJson(out[k], v);
  }
  return out;
}
