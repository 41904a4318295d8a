/**
 * The commands, run inside the launcher's narrowed Worker (main.ts): the permissions are already decided here.
 *
 * The Jumpstarter operator starts the image's /exporter-set-controller with flags only, so flags alone mean `run`.
 */
import { parseArgs } from "node:util";
import { PROVISIONER } from "../api/types.ts";
import { CLUSTER_ID_RE } from "../host/render.ts";
import { crdFiles } from "../api/crds.ts";
import { DEFAULT_BURST, DEFAULT_QPS } from "../kube/flowcontrol.ts";
import { DEFAULT_LAB_HOSTS, LAB_HOSTS_ENV, parseHostAliases, parseLabHosts } from "../host/lab_hosts.ts";

export const VERSION = "0.1.0";

const USAGE = `qemu-ssh-provisioner ${VERSION}: runs Jumpstarter QEMU targets on lab hosts over SSH

usage: qemu-ssh-provisioner [run] [flags]     run the controller (the default)
       qemu-ssh-provisioner crds              print the CustomResourceDefinitions
       qemu-ssh-provisioner render ...        print the files run would write on a lab host (offline; --help)
       qemu-ssh-provisioner doctor ...        check a lab host the way run uses it (--help)
       qemu-ssh-provisioner version | --version

run flags:
  --provisioner NAME                  provisioner to serve (default ${PROVISIONER})
  --kubeconfig PATH                   kubeconfig (default: $KUBECONFIG, then in-cluster, then ~/.kube/config)
  --namespace NS                      watch only NS (default: $NAMESPACE; empty = all namespaces)
  --leader-elect                      elect a leader among replicas (Lease in the namespace)
  --health-probe-bind-address ADDR    /healthz, /readyz, /metrics (default :8081; 0 disables)
  --metrics-bind-address ADDR         a separate /metrics listener (default 0: metrics are on the health port)
  --log-level debug|info|warn|error   (default info; --zap-log-level is taken too)
  --log-format text|json              (default text)
  --zap-log-level, --zap-devel, --zap-encoder json|console: kubebuilder's names, mapped to the two above;
  --zap-stacktrace-level, --zap-time-encoding: accepted and ignored (with a warning)
  --resync SECONDS                    re-apply every instance at least this often (default 300); problems are
                                      retried after 30 s (10 s while a host is unreachable), or this if shorter
  --sweep-interval SECONDS            look for orphaned instances on the lab hosts this often (default 300)
  --teardown-grace SECONDS            how long a deleted Exporter waits for its instance's teardown before its
                                      finalizer goes anyway, with a Warning event (default 120); the host is
                                      remembered and the sweep removes the instance there once it can
  --cluster-id ID                     names this cluster in the ownership of the instances on the lab hosts
                                      (default: the uid of the kube-system namespace, which needs the ClusterRole
                                      in manifests/clusterrole.yaml); unique among clusters sharing lab hosts
  --max-concurrent-reconciles N       ExporterSets reconciled at once (default 32); one set is never
                                      reconciled twice at once
  --kube-api-qps N                    requests a second to the API server, sustained (default 0: no limit of
                                      ours, the server's API Priority and Fairness paces); 429 and 5xx answers
                                      are retried, honouring Retry-After
  --kube-api-burst N                  with --kube-api-qps, requests above that rate allowed at once (default
                                      ${DEFAULT_BURST})
  --max-ssh-connections N             SSH connections open at once, one per lab host and key (default 2000); at
                                      the bound the longest idle one is closed first. Keep it below the nofile
                                      limit minus 256 (Deno raises the soft limit to the hard one at start)
  --lab-hosts LIST                    the lab hosts the controller may connect to, comma-separated host names,
                                      addresses and CIDRs, each with an optional :PORT (default: $${LAB_HOSTS_ENV},
                                      else ${DEFAULT_LAB_HOSTS}); nothing else is reachable
  --host-alias NAME=ADDRESS           connect to ADDRESS for lab host NAME (like a Pod's hostAliases; host keys
                                      are still checked under NAME); repeatable
`;

export class UsageError extends Error {}

/** `permissions`: what the launcher granted this Worker, for `run` to log at debug level. */
export async function main(argv: string[], permissions?: Deno.PermissionOptionsObject): Promise<number> {
  const [first] = argv;
  const command = first && !first.startsWith("-") ? first : "run";
  const rest = command === first ? argv.slice(1) : argv;
  // these two have their own --help and usage errors; each command loads only the modules it uses
  if (command === "render") return await (await import("./render.ts")).renderCommand(rest);
  if (command === "doctor") return await (await import("./doctor.ts")).doctorCommand(rest);
  if (argv.includes("--version")) {
    console.log(VERSION);
    return 0;
  }
  if (argv.includes("--help") || argv.includes("-h") || command === "help") {
    console.log(USAGE);
    return 0;
  }
  switch (command) {
    case "version":
      console.log(VERSION);
      return 0;
    case "crds":
      noArgs(rest, "crds");
      await Deno.stdout.write(new TextEncoder().encode(crdFiles().map((f) => f.yaml).join("---\n")));
      return 0;
    case "run":
      return await (await import("../run.ts")).runController({ ...parseRunFlags(rest), permissions });
    default:
      throw new UsageError(`unknown command "${command}"`);
  }
}

function noArgs(args: string[], cmd: string) {
  if (args.length) throw new UsageError(`${cmd} takes no arguments, got: ${args.join(" ")}`);
}

export function parseRunFlags(args: string[]) {
  const { values, positionals } = parseArgs({
    args,
    strict: true,
    allowPositionals: true,
    options: {
      provisioner: { type: "string", default: PROVISIONER },
      kubeconfig: { type: "string" },
      namespace: { type: "string" },
      "leader-elect": { type: "boolean", default: false },
      "health-probe-bind-address": { type: "string", default: ":8081" },
      "metrics-bind-address": { type: "string", default: "0" },
      "log-level": { type: "string" },
      // kubebuilder's zap flags, which people carry over from other controllers' Deployments
      "zap-log-level": { type: "string" },
      "zap-devel": { type: "boolean" },
      "zap-encoder": { type: "string" },
      "zap-stacktrace-level": { type: "string" },
      "zap-time-encoding": { type: "string" },
      "log-format": { type: "string", default: "text" },
      resync: { type: "string", default: "300" },
      "sweep-interval": { type: "string", default: "300" },
      "teardown-grace": { type: "string", default: "120" },
      "cluster-id": { type: "string" },
      "max-concurrent-reconciles": { type: "string" },
      "kube-api-qps": { type: "string", default: String(DEFAULT_QPS) },
      "kube-api-burst": { type: "string", default: String(DEFAULT_BURST) },
      "max-ssh-connections": { type: "string", default: "2000" },
      "lab-hosts": { type: "string" },
      "host-alias": { type: "string", multiple: true, default: [] },
    },
  });
  if (positionals.length) throw new UsageError(`unexpected argument "${positionals[0]}"`);
  const level = values["log-level"] ?? zapLevel(values["zap-log-level"]) ?? (values["zap-devel"] ? "debug" : "info");
  if (!["debug", "info", "warn", "error"].includes(level)) {
    throw new UsageError(`--log-level: unknown level "${level}"`);
  }
  const format = values["zap-encoder"] === undefined
    ? values["log-format"]
    : { json: "json", console: "text" }[values["zap-encoder"]];
  if (format === undefined) throw new UsageError(`--zap-encoder must be json or console`);
  const ignored = (["zap-stacktrace-level", "zap-time-encoding"] as const).filter((f) => values[f] !== undefined);
  if (format !== "text" && format !== "json") throw new UsageError(`--log-format must be text or json`);
  const resync = seconds(values.resync, "--resync");
  const sweep = seconds(values["sweep-interval"], "--sweep-interval");
  const grace = seconds(values["teardown-grace"], "--teardown-grace");
  const clusterId = values["cluster-id"];
  if (clusterId !== undefined && !CLUSTER_ID_RE.test(clusterId)) {
    throw new UsageError("--cluster-id must be 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit");
  }
  const max = values["max-concurrent-reconciles"];
  const concurrency = max === undefined ? undefined : Number(max);
  if (concurrency !== undefined && (!Number.isInteger(concurrency) || concurrency < 1)) {
    throw new UsageError("--max-concurrent-reconciles must be a whole number >= 1");
  }
  const qps = Number(values["kube-api-qps"]);
  if (!Number.isFinite(qps) || qps < 0) throw new UsageError("--kube-api-qps must be a number >= 0");
  const burst = Number(values["kube-api-burst"]);
  if (!Number.isInteger(burst) || burst < 1) throw new UsageError("--kube-api-burst must be a whole number >= 1");
  const maxSsh = Number(values["max-ssh-connections"]);
  if (!Number.isInteger(maxSsh) || maxSsh < 1) {
    throw new UsageError("--max-ssh-connections must be a whole number >= 1");
  }
  const labHosts = values["lab-hosts"] ?? (Deno.env.get(LAB_HOSTS_ENV) || DEFAULT_LAB_HOSTS);
  let hostAliases: Record<string, string>;
  try {
    parseLabHosts(labHosts);
    hostAliases = parseHostAliases(values["host-alias"]);
  } catch (e) {
    throw new UsageError((e as Error).message);
  }
  return {
    labHosts,
    hostAliases,
    provisioner: values.provisioner,
    kubeconfig: values.kubeconfig,
    namespace: values.namespace ?? (Deno.env.get("NAMESPACE") || undefined),
    leaderElect: values["leader-elect"],
    healthAddress: values["health-probe-bind-address"],
    metricsAddress: values["metrics-bind-address"],
    logLevel: level as "debug" | "info" | "warn" | "error",
    logFormat: format as "text" | "json",
    resyncMs: resync * 1000,
    sweepMs: sweep * 1000,
    teardownGraceMs: grace * 1000,
    clusterId,
    concurrency,
    kubeApi: { qps, burst },
    maxSshConnections: maxSsh,
    warnings: ignored.map((f) => `--${f} is accepted for kubebuilder compatibility and has no effect here`),
  };
}

/** zap's levels: debug, info, error, panic, or a number of debug verbosity. */
function zapLevel(v: string | undefined): string | undefined {
  if (v === undefined) return undefined;
  if (v === "panic") return "error";
  if (/^[1-9][0-9]*$/.test(v)) return "debug";
  if (!["debug", "info", "error"].includes(v)) throw new UsageError(`--zap-log-level: unknown level "${v}"`);
  return v;
}

function seconds(value: string, flag: string): number {
  const n = Number(value);
  if (!Number.isFinite(n) || n < 1) throw new UsageError(`${flag} must be a number of seconds >= 1`);
  return n;
}

/** main() with a process's conventions: usage errors exit 2 with the usage, other errors 1 with one line. */
export async function cli(argv: string[], permissions?: Deno.PermissionOptionsObject): Promise<number> {
  try {
    return await main(argv, permissions);
  } catch (e) {
    if (e instanceof UsageError || (e as { code?: string }).code?.startsWith("ERR_PARSE_ARGS")) {
      console.error(`error: ${(e as Error).message}\n\n${USAGE}`);
      return 2;
    }
    console.error(`error: ${e instanceof Error ? e.message : e}`);
    return 1;
  }
}
