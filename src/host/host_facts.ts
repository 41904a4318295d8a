/**
 * What a lab host is, as far as an instance's files depend on it: the Podman version (which quadlet keys its
 * generator knows) and /dev/kvm (which group the exporter needs to open it). Pure: the apply and inspect scripts
 * (scripts/lib.sh host_facts) print the facts in their own round trip, and the files are rendered for the facts last
 * seen (render.ts). The apply script refuses, before writing anything, files rendered for other facts than the host's
 * (`facts-changed`), so a host whose Podman or kvm group changed never gets files made for what it was.
 */

export interface HostFacts {
  /** `podman --version`'s number, e.g. "5.4.2" or "5.3.0-rc1"; "" when podman printed none. */
  podman: string;
  /** /dev/kvm's permission bits and owning gid, as the containers see them; null: no /dev/kvm device. */
  kvm: { mode: number; gid: number } | null;
}

/** The wire form of files rendered without facts: it never equals a host's, so it is refused. */
export const UNKNOWN_FACTS = "unknown";

/**
 * The one-line form: `podman=5.4.2 kvm=660:993` or `podman=5.4.2 kvm=none`, the mode in octal as `stat -c %a` prints
 * it. lib.sh's host_facts makes the same line on the host, so the apply script compares the two as strings.
 */
export function factsWire(f: HostFacts | undefined): string {
  if (!f) return UNKNOWN_FACTS;
  const kvm = f.kvm ? `${f.kvm.mode.toString(8)}:${f.kvm.gid}` : "none";
  return `podman=${f.podman} kvm=${kvm}`;
}

/**
 * The facts most of the hosts met so far have (the first met of the most common), undefined while none is known. A
 * host's first contact renders for them: a lab's hosts are mostly alike, so its apply goes through in one round trip,
 * where files rendered for no facts always take two (at 500 hosts, 500 refused applies). A host that differs refuses
 * them (`facts-changed`) as it refuses any others, before writing anything.
 */
export function likelyFacts(known: Iterable<HostFacts>): HostFacts | undefined {
  const counts = new Map<string, { facts: HostFacts; n: number }>();
  let best: { facts: HostFacts; n: number } | undefined;
  for (const facts of known) {
    const wire = factsWire(facts);
    const c = counts.get(wire) ?? { facts, n: 0 };
    counts.set(wire, c);
    if (++c.n > (best?.n ?? 0)) best = c;
  }
  return best?.facts;
}

/**
 * The facts of a wire line, undefined when it is not one (a host script from another version, a garbled line). The
 * version is held to the characters of version numbers: it goes back into the next script.
 */
export function parseFacts(line: string): HostFacts | undefined {
  const m = /^podman=([0-9A-Za-z.+~_-]*) kvm=(?:none|([0-7]{1,4}):([0-9]+))$/.exec(line.trim());
  if (!m) return undefined;
  return { podman: m[1], kvm: m[2] === undefined ? null : { mode: parseInt(m[2], 8), gid: Number(m[3]) } };
}

/**
 * How a non-root process in a container (the exporter, uid 65532, where the QEMU driver checks `os.access` and, with
 * the 0.9.0 exporter, runs QEMU) can open /dev/kvm: it is missing; anyone may (`0666`, as Fedora and RHEL ship it);
 * members of its group may (`0660 root:kvm`, as Debian and Ubuntu ship it), so the process needs that gid added;
 * or only its owner may (`0600`), which no added group helps.
 */
export type KvmAccess = { kind: "missing" } | { kind: "world" } | { kind: "group"; gid: number } | {
  kind: "denied";
  mode: number;
  gid: number;
};

export function kvmAccess(kvm: HostFacts["kvm"]): KvmAccess {
  if (!kvm) return { kind: "missing" };
  if ((kvm.mode & 0o006) === 0o006) return { kind: "world" };
  if ((kvm.mode & 0o060) === 0o060) return { kind: "group", gid: kvm.gid };
  return { kind: "denied", mode: kvm.mode, gid: kvm.gid };
}

/** A mode as people write it: 0660. */
export const octalMode = (mode: number) => mode.toString(8).padStart(4, "0");

/** The key facts are remembered under, per host and port: two sshd ports may be two hosts (containers, VMs). */
export const factsKey = (t: { host: string; port: number }) => `${t.host}:${t.port}`;
