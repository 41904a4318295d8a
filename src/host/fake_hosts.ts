/**
 * An in-memory stand-in for LabHosts, for unit tests of reconciling: hosts keep instances as the apply script would
 * leave them (files, and whether each unit runs), can be taken down, and can have an exporter exit by itself.
 */
import { type ApplyOutcome, type HostApplyOptions, type HostOps, HostScriptError } from "./lab.ts";
import { OWNER_PREFIX, type RenderedInstance } from "./render.ts";
import { modeOf } from "./drift.ts";
import { type HostInspection, type HostUnits, type InspectedInstance, sha256 } from "./remote.ts";
import { factsWire, type HostFacts } from "./host_facts.ts";
import { SshError, type SshTarget } from "./ssh.ts";

export interface FakeInstance {
  host: string;
  rendered: RenderedInstance;
  exporter: "active" | "exited";
  /** How often the exporter was started (first start included). */
  starts: number;
  /** A restart deferred under a lease, done by the next apply without deferRestart. */
  pending?: boolean;
  /** How many more inspections (whole or units only) find the exporter activating (its host's startLooks). */
  startingLooks?: number;
}

export class FakeHosts implements HostOps {
  /** By host, then instance name. */
  readonly hosts = new Map<string, Map<string, FakeInstance>>();
  /** Hosts that refuse connections. */
  readonly down = new Set<string>();
  /** Every call, in order: "apply host name", "remove host name", "inspect host", "units host". */
  readonly calls: string[] = [];
  /** By host, the only private key it accepts; a host not listed accepts any. */
  readonly keys = new Map<string, string>();
  /** By host, what inspect finds besides the instances: leftovers that have no files of ours, e.g. a bare volume. */
  readonly strays = new Map<string, InspectedInstance[]>();
  /**
   * By host, its facts: an apply of files rendered for others is refused (facts-changed) as the apply script does.
   * A host not listed takes files rendered for any facts and reports none.
   */
  readonly facts = new Map<string, HostFacts>();
  /**
   * By host, how many of its inspections find an exporter that an apply started or restarted still activating, the
   * apply having reported it so: a real host's apply queues the start and does not wait for it. A host not listed has
   * it up by the time the apply reports.
   */
  readonly startLooks = new Map<string, number>();

  instance(host: string, name: string): FakeInstance | undefined {
    return this.hosts.get(dnsName(host))?.get(name);
  }

  /** The exporter ends by itself (a lease ended, or it crashed); systemd leaves it down. */
  exit(host: string, name: string): void {
    const i = this.instance(host, name)!;
    i.exporter = "exited";
    i.startingLooks = 0;
  }

  apply(
    target: SshTarget,
    r: RenderedInstance,
    opts: HostApplyOptions,
  ): Promise<ApplyOutcome> {
    this.reach(target, `apply ${target.host} ${r.name}`);
    const facts = this.facts.get(target.host);
    if (facts && factsWire(facts) !== factsWire(r.facts)) {
      const message = `facts-changed: this host is ${factsWire(facts)}; the files were rendered for ${
        factsWire(r.facts)
      }`;
      return Promise.resolve({
        changed: [],
        ready: false,
        starting: false,
        exited: false,
        restartPending: false,
        startedExporter: false,
        exporterRestarts: 0,
        journal: [],
        errors: [message],
        errorCode: "facts-changed",
        facts,
      });
    }
    const host = this.on(target.host);
    const before = host.get(r.name);
    this.checkOwner(target, before, r.uid);
    const old = new Map(before?.rendered.files.map((f) => [f.path, f.content]));
    const changed = r.files.filter((f) => old.get(f.path) !== f.content).map((f) => f.path);
    const inst: FakeInstance = before ?? { host: target.host, rendered: r, exporter: "exited", starts: 0 };
    inst.rendered = r;
    host.set(r.name, inst);
    // as the apply script: a changed quadlet restarts the exporter, unless deferred; an exporter found down starts
    // unless held
    const outdated = (inst.pending || changed.some((p) => p.endsWith(".container"))) && inst.exporter === "active";
    inst.pending = outdated && opts.deferRestart === true;
    const restart = outdated && !opts.deferRestart;
    const start = inst.exporter === "exited" && !opts.keepExited;
    if (start || restart) {
      inst.exporter = "active";
      inst.starts++;
      inst.startingLooks = this.startLooks.get(target.host);
    }
    const starting = (inst.startingLooks ?? 0) > 0;
    const ready = inst.exporter === "active" && !starting;
    return Promise.resolve({
      changed,
      ready,
      starting,
      exited: inst.exporter === "exited",
      restartPending: inst.pending,
      // as LabHosts: a restart for a change is not the exporter going down
      startedExporter: start,
      exporterRestarts: 0,
      journal: inst.exporter === "exited" ? ["exporter exited"] : [],
      errors: [],
      ...(facts ? { facts } : {}),
    });
  }

  remove(target: SshTarget, name: string, uid?: string): Promise<void> {
    this.reach(target, `remove ${target.host} ${name}`);
    this.checkOwner(target, this.instance(target.host, name), uid);
    this.hosts.get(dnsName(target.host))?.delete(name);
    return Promise.resolve();
  }

  inspect(target: SshTarget): Promise<HostInspection> {
    this.reach(target, `inspect ${target.host}`);
    const instances = [...this.look(target.host), ...this.strays.get(target.host) ?? []];
    const facts = this.facts.get(target.host);
    return Promise.resolve({ ok: true, ...(facts ? { facts } : {}), diskFreeKiB: {}, instances, errors: [] });
  }

  units(target: SshTarget): Promise<HostUnits> {
    this.reach(target, `units ${target.host}`);
    const units: HostUnits["units"] = {};
    for (const i of this.look(target.host)) {
      units[`${i.name}-runtime.service`] = i.runtime!;
      units[`${i.name}-exporter.service`] = i.exporter!;
    }
    return Promise.resolve({ ok: true, units, errors: [] });
  }

  /** The host's instances as an inspection finds them; each look counts down an exporter's startingLooks. */
  private look(host: string): InspectedInstance[] {
    return [...this.on(host).values()].map((i) => {
      const seen = inspected(i);
      if (i.startingLooks) i.startingLooks--;
      return seen;
    });
  }

  private on(host: string): Map<string, FakeInstance> {
    let m = this.hosts.get(dnsName(host));
    if (!m) this.hosts.set(dnsName(host), m = new Map());
    return m;
  }

  private reach(target: SshTarget, call: string): void {
    this.calls.push(call);
    if (this.down.has(target.host)) throw new SshError("connect", target, `connect ECONNREFUSED ${target.host}`);
    const key = this.keys.get(target.host);
    if (key !== undefined && key !== target.privateKey) {
      throw new SshError("auth", target, `${target.user}@${target.host}: all configured authentication methods failed`);
    }
  }

  /** As the scripts' ownership step: files that name another exporter's uid are refused. */
  private checkOwner(target: SshTarget, inst: FakeInstance | undefined, uid: string | undefined): void {
    if (inst && uid && inst.rendered.uid !== uid) {
      throw new HostScriptError(
        target.host,
        "owner-conflict",
        `${inst.rendered.name} belongs to exporter uid=${inst.rendered.uid}, not uid=${uid}`,
      );
    }
  }
}

/** A machine answers to its name in any case, as DNS resolves it. */
const dnsName = (host: string) => host.toLowerCase();

function inspected(i: FakeInstance): InspectedInstance {
  const r = i.rendered;
  const owner = r.files.flatMap((f) => f.content.split("\n")).find((l) => l.startsWith(OWNER_PREFIX)) ?? "";
  const unit = (active: string) => ({ load: "loaded", active, sub: active === "active" ? "running" : "dead" });
  return {
    name: r.name,
    namespace: r.namespace,
    uid: r.uid,
    set: /\bset=(\S+)/.exec(owner)?.[1],
    setUid: /\bset-uid=(\S+)/.exec(owner)?.[1],
    controller: /\bcontroller=(\S+)/.exec(owner)?.[1],
    retain: owner.includes(" reclaim=Retain"),
    files: r.files.flatMap((f) =>
      [f.path, ...f.links].map((path) => ({
        kind: path.endsWith("-runtime.container") ? "runtime" : path.endsWith(".container") ? "exporter" : "config",
        path,
        mode: modeOf(f),
        sha256: sha256(f.content),
      }))
    ),
    ownerMismatch: false,
    runtime: unit("active"),
    exporter: i.startingLooks
      ? { load: "loaded", active: "activating", sub: "start" }
      : unit(i.exporter === "active" ? "active" : "inactive"),
    containers: [],
    volume: true,
    diskVolume: true,
  };
}
