/**
 * `doctor`: checks a lab host the way `run` uses it, one line per check and a fix for each failure. The target is
 * either given directly (host, key, known_hosts) or resolved from the cluster's VirtualTargetClass, ExporterSet and
 * Secret exactly as the reconciler does. The host is reached as run reaches it: the same SSH pool (one connection),
 * the inspect script, and one small script for what inspect does not tell (rights, images, devices).
 */
import { parseArgs } from "node:util";
import { homedir } from "node:os";
import { PROVISIONER } from "../api/types.ts";
import type { ExporterSet, Secret, VirtualTargetClass } from "../api/types.ts";
import { isNotFound, KubeClient } from "../kube/client.ts";
import { EXPORTER_SETS, SECRETS, VIRTUAL_TARGET_CLASSES } from "../kube/resources.ts";
import { DEFAULT_IMAGES, fieldErrorLine } from "../provision/params.ts";
import {
  DEFAULT_FS_OVERHEAD,
  DEFAULT_STORAGE_SIZE,
  diskVolumeBytes,
  type ImageChoice,
} from "../host/instance_params.ts";
import { DISK_DIR } from "../host/render.ts";
import { PINNED_HOST_KEYS_SECRET } from "../provision/credentials.ts";
import { setTarget, targetString } from "../provision/targets.ts";
import { fingerprint, lookup } from "../host/known_hosts.ts";
import { checkPrivateKey, type PrivateKeyCheck } from "../host/ssh_key.ts";
import { SshError, SshPool, type SshTarget } from "../host/ssh.ts";
import { LabHosts } from "../host/lab.ts";
import { netAddress, parseHostAliases } from "../host/lab_hosts.ts";
import { type HostInspection, podmanTooOld, shellCommand, shQuote } from "../host/remote.ts";
import { MIN_PODMAN, networkFormText } from "../host/quadlet_dialect.ts";
import { kvmAccess, octalMode } from "../host/host_facts.ts";
import { dialectOf, EXPORTER_UID } from "../host/render.ts";
import { consoleIo, type Io, parseFlags } from "./render.ts";

export const DOCTOR_USAGE = `usage: qemu-ssh-provisioner doctor --host HOST [--port 22] [--user root] --key PATH
                                   [--known-hosts PATH | --accept-new] [--address IP] [-o text|json]
       qemu-ssh-provisioner doctor [--kubeconfig PATH] --namespace NS --class NAME [--set NAME]
                                   [--host-alias NAME=ADDRESS ...] [-o text|json]

Checks a lab host the way run uses it: TCP, the SSH host key, login, root rights, systemd, podman and quadlet,
/dev/kvm, the images and devices the containers need, free disk. One line per check, with a fix for each failure.

direct:
  --host HOST            the lab host (as in parameters.host.name; host keys are checked under this name)
  --port PORT, --user U  SSH port and user (default 22, root; other users need passwordless sudo)
  --key PATH             the private key (unencrypted ed25519 or RSA, as in the Secret's ssh-privatekey)
  --known-hosts PATH     known_hosts to check the host key against (default ~/.ssh/known_hosts)
  --accept-new           trust an unknown host key for this check (as hostKeyPolicy AcceptNew)
  --address IP           connect here instead of HOST
from the cluster (read-only):
  --kubeconfig PATH      as for run (default: in-cluster, then $KUBECONFIG, then ~/.kube/config)
  --namespace NS         the namespace of the class and set
  --class NAME           the VirtualTargetClass (default: the set's)
  --set NAME             an ExporterSet, whose parameters override the class's
  --host-alias NAME=ADDRESS   connect to ADDRESS for lab host NAME, as run does; repeatable
output:
  -o, --output text|json text (default): one line per check; json: one object when done, {"host", "ready",
                         "checks": [{"name", "status": "ok"|"warn"|"fail", "detail", "fix": [...]}]}

Without --class, the default images are checked and /dev/kvm is optional.
Exit status: 0 every check passed (warnings allowed), 1 a check failed, 2 usage error.`;

/** Below this much free space under /etc or /var/lib/containers, image pulls and volumes may fail. */
const LOW_DISK_KIB = 2 * 1024 * 1024;
/** Podman >= this: see MIN_PODMAN, the floor the apply script enforces too. */
const QUADLET_PODMAN = MIN_PODMAN.join(".");
const TCP_TIMEOUT_MS = 5_000;

export type DoctorOutput = "text" | "json";

interface HostFlags {
  mode: "host";
  output: DoctorOutput;
  host: string;
  port: number;
  user: string;
  key: string;
  knownHosts?: string;
  acceptNew: boolean;
  address?: string;
}

interface ClusterFlags {
  mode: "cluster";
  output: DoctorOutput;
  kubeconfig?: string;
  namespace: string;
  className?: string;
  setName?: string;
  hostAliases: Record<string, string>;
}

export type DoctorFlags = HostFlags | ClusterFlags;

export function parseDoctorFlags(args: string[]): DoctorFlags {
  const { values, positionals } = parseArgs({
    args,
    strict: true,
    allowPositionals: true,
    options: {
      host: { type: "string" },
      port: { type: "string" },
      user: { type: "string" },
      key: { type: "string" },
      "known-hosts": { type: "string" },
      "accept-new": { type: "boolean" },
      address: { type: "string" },
      kubeconfig: { type: "string" },
      namespace: { type: "string" },
      class: { type: "string" },
      set: { type: "string" },
      "host-alias": { type: "string", multiple: true },
      output: { type: "string", short: "o", default: "text" },
    },
  });
  if (positionals.length) throw new Error(`unexpected argument "${positionals[0]}"`);
  const output = values.output as DoctorOutput;
  if (output !== "text" && output !== "json") throw new Error(`-o/--output must be text or json, got "${output}"`);
  const given = (names: (keyof typeof values)[]) => names.filter((n) => values[n] !== undefined).map((n) => `--${n}`);
  const hostOnly = given(["port", "user", "key", "known-hosts", "accept-new", "address"]);
  const clusterOnly = given(["kubeconfig", "namespace", "host-alias"]);
  if (values.host !== undefined && (values.class !== undefined || values.set !== undefined)) {
    throw new Error("--host checks a host given directly, --class/--set one from the cluster: use one or the other");
  }
  if (values.host !== undefined) {
    if (clusterOnly.length) throw new Error(`${clusterOnly.join(", ")}: only with --class/--set`);
    if (values.key === undefined) throw new Error("--host needs --key PATH (the private key to log in with)");
    if (values["known-hosts"] !== undefined && values["accept-new"]) {
      throw new Error("--known-hosts and --accept-new exclude each other");
    }
    const port = Number(values.port ?? 22);
    if (!Number.isInteger(port) || port < 1 || port > 65535) {
      throw new Error(`--port must be 1-65535, got ${values.port}`);
    }
    return {
      mode: "host",
      output,
      host: values.host,
      port,
      user: values.user ?? "root",
      key: values.key,
      knownHosts: values["known-hosts"],
      acceptNew: values["accept-new"] ?? false,
      address: values.address,
    };
  }
  if (values.class === undefined && values.set === undefined) {
    throw new Error("give --host HOST --key PATH, or --namespace NS --class NAME to check a class's host");
  }
  if (hostOnly.length) throw new Error(`${hostOnly.join(", ")}: only with --host`);
  if (values.namespace === undefined) throw new Error("--class/--set need --namespace NS");
  const hostAliases = parseHostAliases(values["host-alias"] ?? []);
  return {
    mode: "cluster",
    output,
    kubeconfig: values.kubeconfig,
    namespace: values.namespace,
    className: values.class,
    setName: values.set,
    hostAliases,
  };
}

/** Whether the locale promises UTF-8, as the first of LC_ALL, LC_CTYPE, LANG that is set decides. */
export function localeIsUtf8(): boolean {
  const locale = Deno.env.get("LC_ALL") || Deno.env.get("LC_CTYPE") || Deno.env.get("LANG") || "";
  return /utf-?8/i.test(locale);
}

export async function doctorCommand(args: string[], io: Io = consoleIo, utf8 = localeIsUtf8()): Promise<number> {
  const flags = parseFlags(DOCTOR_USAGE, args, io, parseDoctorFlags);
  if (typeof flags === "number") return flags;
  const report = new Report(io, utf8, flags.output);
  const subject = flags.mode === "host" ? await directSubject(flags, report) : await clusterSubject(flags, report);
  if (subject) await checkHost(subject, report);
  return report.verdict(subject?.target);
}

// ---------------------------------------------------------------- the report

type Status = "ok" | "warn" | "fail";

/** One check, as `-o json` prints it. */
export interface Check {
  name: string;
  status: Status;
  detail: string;
  /** What to do about a failure or warning, one step each; empty when there is nothing to do. */
  fix: string[];
}

/** `doctor -o json`: the whole report, printed once the checks are done. */
export interface DoctorJson {
  /** user@host:port as run reaches it; null when the checks stopped before a host was known. */
  host: string | null;
  /** The address connected to instead of the host's name (--address, --host-alias). */
  address?: string;
  /** No check failed (the exit status is 0). */
  ready: boolean;
  checks: Check[];
}

class Report {
  readonly #checks: Check[] = [];
  readonly #marks: Record<Status, string>;
  readonly #arrow: string;

  constructor(private readonly io: Io, utf8: boolean, private readonly output: DoctorOutput = "text") {
    this.#marks = utf8 ? { ok: "✓", warn: "!", fail: "✗" } : { ok: "ok  ", warn: "WARN", fail: "FAIL" };
    this.#arrow = utf8 ? "→" : "->";
  }

  add(status: Status, name: string, detail: string, ...fixes: string[]): void {
    this.#checks.push({ name, status, detail, fix: fixes });
    if (this.output === "json") return;
    this.io.out(`${this.#marks[status]} ${name.padEnd(11)} ${detail}`);
    const indent = " ".repeat(this.#marks[status].length + 13);
    for (const f of fixes) this.io.out(`${indent}${this.#arrow} ${f}`);
  }

  /** Prints the verdict line and returns the exit status. */
  verdict(target: SshTarget | undefined): number {
    const failed = this.#checks.filter((c) => c.status === "fail");
    const warned = this.#checks.filter((c) => c.status === "warn");
    const names = (cs: Check[]) => [...new Set(cs.map((c) => c.name))].join(", ");
    const where = target ? `${targetString(target)}${via(target)}` : "the lab host";
    if (this.output === "json") {
      const json: DoctorJson = {
        host: target ? targetString(target) : null,
        ...(target && via(target) ? { address: target.address } : {}),
        ready: failed.length === 0,
        checks: this.#checks,
      };
      this.io.out(JSON.stringify(json, null, 2));
      return failed.length ? 1 : 0;
    }
    if (failed.length) {
      this.io.out(
        `\nverdict: ${where} is NOT ready for ${PROVISIONER}: ${failed.length} check(s) failed (${names(failed)})` +
          (warned.length ? `, ${warned.length} warning(s) (${names(warned)})` : ""),
      );
      return 1;
    }
    this.io.out(
      `\nverdict: ${where} is ready for ${PROVISIONER}: ${this.#checks.length} checks passed` +
        (warned.length ? `, ${warned.length} with a warning (${names(warned)})` : ""),
    );
    return 0;
  }
}

const via = (t: SshTarget) => t.address && t.address !== t.host ? ` (via ${t.address})` : "";
const errorText = (e: unknown) => e instanceof Error ? e.message : String(e);

// ---------------------------------------------------------------- what to check

type ClientKey = PrivateKeyCheck & { ok: true };

/** The target and what run would need on it. */
interface Subject {
  target: SshTarget;
  key: ClientKey;
  /** undefined: no class says (direct mode). */
  kvm?: boolean;
  images: ImageChoice[];
  /** Host device paths of runtime.devices. */
  devices: string[];
  /** Bytes of one instance's /disk volume: the class and set's, else upstream's default. */
  diskBytes: number;
  /** What becomes of a host key known_hosts does not have, when the policy accepts it. */
  newKey: string;
}

async function directSubject(f: HostFlags, report: Report): Promise<Subject | undefined> {
  let privateKey: string;
  try {
    privateKey = await Deno.readTextFile(f.key);
  } catch (e) {
    report.add("fail", "client key", `cannot read ${f.key}: ${errorText(e)}`);
    return undefined;
  }
  const key = checkPrivateKey(privateKey);
  if (!key.ok) {
    report.add("fail", "client key", `${f.key}: ${key.reason}`);
    return undefined;
  }
  report.add("ok", "client key", `${f.key}: ${key.type} ${key.fingerprint}`);
  let knownHosts = "";
  const knownHostsPath = f.knownHosts ?? `${homedir()}/.ssh/known_hosts`;
  if (!f.acceptNew) {
    try {
      knownHosts = await Deno.readTextFile(knownHostsPath);
    } catch (e) {
      // the default file may well be missing; the host key check then says what to do
      if (f.knownHosts !== undefined || !(e instanceof Deno.errors.NotFound)) {
        report.add("fail", "known hosts", `cannot read ${knownHostsPath}: ${errorText(e)}`);
        return undefined;
      }
    }
  }
  return {
    key,
    target: {
      host: f.host,
      address: f.address,
      port: f.port,
      user: f.user,
      privateKey,
      knownHosts,
      hostKeyPolicy: f.acceptNew ? "AcceptNew" : "Strict",
    },
    images: [
      { image: DEFAULT_IMAGES.exporter, pullPolicy: "IfNotPresent" },
      { image: DEFAULT_IMAGES.runtime, pullPolicy: "IfNotPresent" },
    ],
    devices: [],
    diskBytes: diskVolumeBytes(DEFAULT_STORAGE_SIZE, DEFAULT_FS_OVERHEAD),
    newKey: "is not in known_hosts; accepted for this check (--accept-new)",
  };
}

/** Reads the class, set and Secrets and resolves them as the reconciler does; reports each step. */
async function clusterSubject(f: ClusterFlags, report: Report): Promise<Subject | undefined> {
  const ns = f.namespace;
  let client: KubeClient | undefined;
  let cls: VirtualTargetClass, set: ExporterSet, credentials: Secret | undefined, pinned: Secret | undefined;
  try {
    client = await KubeClient.load(f.kubeconfig);
    const found = f.setName ? await client.find<ExporterSet>(EXPORTER_SETS, ns, f.setName) : undefined;
    if (f.setName && !found) {
      report.add("fail", "cluster", `ExporterSet ${ns}/${f.setName} not found`, `kubectl get exportersets -n ${ns}`);
      return undefined;
    }
    const className = f.className ?? found!.spec.virtualTargetClassName;
    if (found && found.spec.virtualTargetClassName !== className) {
      report.add(
        "fail",
        "cluster",
        `ExporterSet ${ns}/${f.setName} uses VirtualTargetClass ${found.spec.virtualTargetClassName}, not ${className}`,
        "drop --class, or name the set's class",
      );
      return undefined;
    }
    const c = await client.find<VirtualTargetClass>(VIRTUAL_TARGET_CLASSES, ns, className);
    if (!c) {
      report.add(
        "fail",
        "cluster",
        `VirtualTargetClass ${ns}/${className} not found`,
        `kubectl get virtualtargetclasses -n ${ns}`,
      );
      return undefined;
    }
    cls = c;
    // without a set, the class's parameters alone, as for a set that overrides nothing
    set = found ?? { metadata: { name: "(no --set)", namespace: ns }, spec: { virtualTargetClassName: className } };
    credentials = cls.spec.credentialsSecretRef
      ? await client.find<Secret>(SECRETS, ns, cls.spec.credentialsSecretRef.name)
      : undefined;
    pinned = await client.find<Secret>(SECRETS, ns, PINNED_HOST_KEYS_SECRET);
    report.add(
      "ok",
      "cluster",
      `VirtualTargetClass ${ns}/${className}${found ? `, ExporterSet ${ns}/${f.setName}` : ""} from ${client.server}`,
    );
  } catch (e) {
    report.add(
      "fail",
      "cluster",
      isNotFound(e) ? `${errorText(e)} (are the CRDs installed?)` : errorText(e),
      "check --kubeconfig and that it may get virtualtargetclasses, exportersets and secrets in the namespace",
    );
    return undefined;
  } finally {
    client?.close();
  }

  if (cls.spec.provisioner !== PROVISIONER) {
    report.add(
      "fail",
      "parameters",
      `VirtualTargetClass ${cls.metadata.name}: spec.provisioner is ${cls.spec.provisioner}, not ${PROVISIONER}`,
      `set spec.provisioner: ${PROVISIONER} for run to serve it`,
    );
    return undefined;
  }
  const secrets: Record<string, Secret | undefined> = {
    [cls.spec.credentialsSecretRef?.name ?? ""]: credentials,
    [PINNED_HOST_KEYS_SECRET]: pinned,
  };
  const cred = setTarget(cls, set, (name) => secrets[name]);
  if (!cred.ok && cred.stage === "parameters") {
    report.add("fail", "parameters", `${cred.errors.length} problem(s):`, ...cred.errors.map(fieldErrorLine));
    return undefined;
  }
  const params = cred.params;
  report.add("ok", "parameters", "valid");
  for (const w of cred.warnings) report.add("warn", "parameters", w);
  if (!cred.ok) {
    report.add("fail", "credentials", cred.problem.message);
    return undefined;
  }
  // sshTarget refuses a key that does not pass this check
  const key = checkPrivateKey(cred.target.privateKey) as ClientKey;
  const trust = cred.tofu
    ? `trust on first use, pinned in Secret ${ns}/${PINNED_HOST_KEYS_SECRET}`
    : `hostKeyPolicy ${cred.target.hostKeyPolicy}`;
  report.add(
    "ok",
    "credentials",
    `Secret ${ns}/${cls.spec.credentialsSecretRef!.name}: ${key.type} ${key.fingerprint}; ${trust}`,
  );
  const address = f.hostAliases[cred.target.host];
  return {
    key,
    target: address ? { ...cred.target, address } : cred.target,
    kvm: params.runtime.kvm,
    images: [params.images.exporter, params.images.runtime],
    devices: params.runtime.devices.map((d) => d.split(":")[0]),
    diskBytes: params.diskBytes,
    newKey: `is new: run will pin it in Secret ${ns}/${PINNED_HOST_KEYS_SECRET} when it first connects`,
  };
}

// ---------------------------------------------------------------- the host

async function checkHost(s: Subject, report: Report): Promise<void> {
  const t = s.target;
  if (!await checkTcp(t, report)) return;

  let accepted: string | undefined;
  const pool = new SshPool({
    connectTimeoutMs: 15_000,
    commandTimeoutMs: 60_000,
    // Nothing is pinned: doctor only reads. Under AcceptNew this is how a new key shows itself.
    onHostKeyAccepted: (_t, line, fp) => {
      accepted = `${line.split(" ")[1]} ${fp}`;
    },
  });
  try {
    let probe;
    try {
      probe = await pool.exec(t, shellCommand(t.user), { stdin: probeScript(s) });
    } catch (e) {
      reportSshFailure(e, s, accepted, report);
      return;
    }
    reportHostKey(s, accepted, report);
    report.add("ok", "login", `${t.user} accepted ${s.key.type} ${s.key.fingerprint}`);
    const lines = probe.stdout.split("\n").filter((l) => l.startsWith("qsp ")).map((l) => l.slice(4).split(" "));
    const uid = lines.find(([k]) => k === "uid")?.[1];
    if (uid !== "0") {
      const why = probe.stderr.trim().split("\n").slice(-2).join(" | ") || `exit ${probe.code}`;
      const fix =
        `on the host: echo '${t.user} ALL=(root) NOPASSWD: /bin/sh' >/etc/sudoers.d/qemu-ssh, or log in as root`;
      report.add(
        "fail",
        "rights",
        uid === undefined ? `${t.user} cannot run sh as root: ${why}` : `sh runs as uid ${uid}, not root`,
        ...(t.user === "root" ? [] : [fix]),
      );
      return;
    }
    report.add("ok", "rights", t.user === "root" ? "root" : `${t.user} runs sh as root with passwordless sudo`);

    let inspection: HostInspection;
    try {
      inspection = await new LabHosts(pool).inspect(t);
    } catch (e) {
      report.add("fail", "inspect", errorText(e), "run the check again; if it persists, look at the host's logs");
      return;
    }
    reportInspection(s, inspection, lines, report);
  } finally {
    await pool.close();
  }
}

/** A TCP connection and sshd's greeting, so "unreachable" and "not an SSH server" are told apart from SSH trouble. */
async function checkTcp(t: SshTarget, report: Report): Promise<boolean> {
  const address = t.address ?? t.host;
  const where = netAddress(address, t.port);
  let conn: Deno.TcpConn;
  try {
    conn = await Deno.connect({ hostname: address, port: t.port, signal: AbortSignal.timeout(TCP_TIMEOUT_MS) });
  } catch (e) {
    report.add(
      "fail",
      "tcp",
      `cannot connect to ${where}: ${errorText(e)}`,
      "check the host's name or address and port, that sshd runs, and that no firewall is in the way",
    );
    return false;
  }
  try {
    const buf = new Uint8Array(256);
    const timer = setTimeout(() => conn.close(), TCP_TIMEOUT_MS);
    const n = await conn.read(buf).catch(() => null).finally(() => clearTimeout(timer));
    const banner = new TextDecoder().decode(buf.subarray(0, n ?? 0)).split(/\r?\n/)[0];
    if (!banner.startsWith("SSH-")) {
      report.add(
        "fail",
        "tcp",
        `${where} answers, but not with an SSH greeting${banner ? `: ${JSON.stringify(banner.slice(0, 60))}` : ""}`,
        "point the port at sshd (parameters.host.port or ssh.port)",
      );
      return false;
    }
    report.add("ok", "tcp", `${where} answers: ${banner}`);
    return true;
  } finally {
    try {
      conn.close();
    } catch {
      // closed by the timer already
    }
  }
}

function reportSshFailure(e: unknown, s: Subject, accepted: string | undefined, report: Report): void {
  const t = s.target;
  if (!(e instanceof SshError)) {
    report.add("fail", "ssh", errorText(e));
    return;
  }
  switch (e.kind) {
    case "hostkey":
      report.add(
        "fail",
        "host key",
        e.message,
        lookup(t.knownHosts, t.host, t.port).keys.length
          ? "if the host was reinstalled, replace its line in known_hosts after verifying the new fingerprint"
          : `verify the fingerprint with the host's owner, then add what \`ssh-keyscan -p ${t.port} ${t.host}\` ` +
            "prints to known_hosts",
      );
      return;
    case "auth": {
      reportHostKey(s, accepted, report);
      report.add("fail", "login", e.message, `on the host, add to ~${t.user}/.ssh/authorized_keys: ${s.key.publicKey}`);
      return;
    }
    case "key":
      report.add("fail", "client key", e.message);
      return;
    default:
      report.add("fail", "ssh", e.message, "sshd accepted TCP but the SSH session failed; see the host's sshd log");
  }
}

/** The host key was accepted (the pool refuses any other): say against what. */
function reportHostKey(s: Subject, accepted: string | undefined, report: Report): void {
  const t = s.target;
  if (accepted) {
    report.add(
      "warn",
      "host key",
      `${accepted} ${s.newKey}`,
      "compare the fingerprint with `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` on the host",
    );
    return;
  }
  const keys = lookup(t.knownHosts, t.host, t.port).keys.map((k) => `${k.type} ${fingerprint(k.blob)}`);
  report.add("ok", "host key", `matches known_hosts: ${keys.length === 1 ? keys[0] : `one of ${keys.join(", ")}`}`);
}

/** What inspect does not report: the user sh runs as, whether the images and devices are there. */
function probeScript(s: Subject): string {
  const q = shQuote;
  return `echo "qsp uid $(id -u)"
if command -v podman >/dev/null 2>&1; then
  for i in ${s.images.map((i) => q(i.image)).join(" ")}; do
    if podman image exists "$i"; then echo "qsp image yes $i"; else echo "qsp image no $i"; fi
  done
fi
for d in ${s.devices.map(q).join(" ")}; do
  if [ -e "$d" ]; then echo "qsp device yes $d"; else echo "qsp device no $d"; fi
done
`;
}

function reportInspection(s: Subject, h: HostInspection, probe: string[][], report: Report): void {
  if (h.systemdVersion === undefined) {
    report.add("fail", "systemd", "not found", "quadlets need systemd as the host's init system");
  } else report.add("ok", "systemd", `systemd ${h.systemdVersion}`);

  const podman = h.facts?.podman || undefined;
  const old = podman === undefined ? undefined : podmanTooOld(podman);
  if (!podman) report.add("fail", "podman", "not installed", `install podman >= ${QUADLET_PODMAN}`);
  else if (old) {
    report.add(
      "fail",
      "podman",
      `podman ${podman} is too old: it has no quadlet (since ${QUADLET_PODMAN}; Debian 12 ships 4.3.1), and run ` +
        "refuses to deploy here (PodmanTooOld)",
      `upgrade podman to ${QUADLET_PODMAN} or later`,
    );
  } else if (old === undefined) {
    report.add(
      "warn",
      "podman",
      `podman ${podman}: not a version number; run deploys as for the newest Podman (exporter in ` +
        `${networkFormText(dialectOf(podman))}), and needs >= 5.4 for that`,
      "make sure this podman's quadlet understands Network=<name>.container",
    );
  } else {
    report.add(
      "ok",
      "podman",
      `podman ${podman}: exporter in the runtime's network by ${networkFormText(dialectOf(podman))}`,
    );
  }
  if (h.generator) report.add("ok", "quadlet", `generator ${h.generator}`);
  else {
    report.add(
      "fail",
      "quadlet",
      "no quadlet generator: .container files would not become services",
      `install podman >= ${QUADLET_PODMAN} with its systemd generator (Debian/Ubuntu: podman; RHEL: podman)`,
    );
  }

  const kvm = h.facts?.kvm ?? null;
  const access = kvmAccess(kvm);
  if (kvm && access.kind === "denied") {
    const mode = `/dev/kvm is mode ${octalMode(kvm.mode)} (gid ${kvm.gid})`;
    const fix = "make it 0660 root:kvm (udev rule; Debian/Ubuntu's default) or 0666 (Fedora/RHEL's default)";
    if (s.kvm) {
      report.add("fail", "kvm", `${mode}: the exporter (uid ${EXPORTER_UID}) cannot open it (KvmDenied)`, fix);
    } else report.add("warn", "kvm", `${mode}: classes with runtime.kvm: true are refused here (KvmDenied)`, fix);
  } else if (kvm) {
    const how = access.kind === "group" ? "its group is added to the exporter" : "open to all";
    report.add("ok", "kvm", `/dev/kvm present (mode ${octalMode(kvm.mode)}, gid ${kvm.gid}): ${how}`);
  } else if (s.kvm === undefined) {
    report.add("warn", "kvm", "/dev/kvm missing: classes with runtime.kvm: true cannot run here");
  } else if (s.kvm) {
    report.add(
      "fail",
      "kvm",
      "/dev/kvm missing, and runtime.kvm is true",
      "enable virtualization in the firmware and load kvm_intel or kvm_amd, or set runtime.kvm: false",
    );
  } else report.add("ok", "kvm", "/dev/kvm missing, not needed (runtime.kvm is false)");

  const has = (kind: string, name: string) => probe.find(([k, , n]) => k === kind && n === name)?.[1] === "yes";
  if (podman) {
    for (const { image, pullPolicy } of s.images) {
      if (has("image", image)) report.add("ok", "image", `${image} present`);
      else if (pullPolicy === "Never") {
        report.add(
          "fail",
          "image",
          `${image} missing, and imagePullPolicy is Never`,
          `on the host: podman pull ${image} (or load it), or allow pulling`,
        );
      } else {
        report.add(
          "warn",
          "image",
          `${image} missing: pulled at the first start (imagePullPolicy ${pullPolicy})`,
          "the host must reach the registry; pull it ahead to make the first start quick",
        );
      }
    }
  }
  for (const d of s.devices) {
    if (has("device", d)) report.add("ok", "device", `${d} present`);
    else {report.add(
        "fail",
        "device",
        `${d} missing (runtime.devices)`,
        "attach the device or drop it from runtime.devices",
      );}
  }

  for (const dir of ["/etc", "/var/lib/containers", DISK_DIR]) {
    const kib = h.diskFreeKiB[dir];
    const gib = (k: number) => `${(k / 2 ** 20).toFixed(1)} GiB`;
    // /disk images are sparse: they take what the guests write, up to their size, which one instance must find
    const need = dir === DISK_DIR ? Math.max(LOW_DISK_KIB, s.diskBytes / 1024) : LOW_DISK_KIB;
    if (kib === undefined) report.add("warn", "disk", `${dir}: free space unknown (df failed)`);
    else if (kib < need) {
      report.add(
        "warn",
        "disk",
        dir === DISK_DIR
          ? `${dir}: only ${gib(kib)} free, less than one instance's /disk of ${gib(need)} (storage.size plus ` +
            "storage.fsOverhead): a guest that fills its disk fails with ENOSPC before /disk is full"
          : `${dir}: only ${gib(kib)} free`,
        "images and the QEMU disks need room: free some (podman system prune) or grow the file system",
      );
    } else report.add("ok", "disk", `${dir}: ${gib(kib)} free`);
  }
}
