/**
 * The Deno permissions a command runs under, decided at start from its flags and environment (main.ts grants them
 * to the Worker that runs it). Pure: what the file system holds comes in as `Facts`.
 *
 * `run` may reach the API server (and a kubeconfig's proxy), its own listeners and the lab hosts (--lab-hosts), and
 * read its credentials; nothing else. The other commands get what their flags name.
 */
import { parseArgs } from "node:util";
import { parseBindAddress } from "../observe/health.ts";
import {
  DEFAULT_LAB_HOSTS,
  LAB_HOSTS_ENV,
  labHostGrants,
  netAddress,
  parseHostAliases,
  parseLabHosts,
} from "../host/lab_hosts.ts";
import { hostPort, kubeconfigNeeds, proxyFromEnvironment, SERVICE_ACCOUNT_DIR } from "../kube/kubeconfig_needs.ts";

/** What src/kube/kubeconfig.ts reads (an ungranted variable reads as unset there), and the controller's own two. */
const CLIENT_ENV = [
  "KUBECONFIG",
  "HOME",
  "KUBERNETES_SERVICE_HOST",
  "KUBERNETES_SERVICE_PORT",
  ...["HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY"].flatMap((n) => [n, n.toLowerCase()]),
];

/** npm:yaml's parser reads these two (debug output) whenever it parses. */
const YAML_ENV = ["LOG_TOKENS", "LOG_STREAM"];

export interface Facts {
  env: Record<string, string | undefined>;
  /** The home directory (client-go's ~/.kube/config, OpenSSH's ~/.ssh/known_hosts). */
  home?: string;
  /** A file's text, or undefined when it does not exist or cannot be read. */
  readFile(path: string): string | undefined;
  /** Where the Worker loads the program from (the bundle, the binary's embedded files, or the source tree). */
  code: string;
}

export type Permissions = Required<Omit<Deno.PermissionOptionsObject, "import">> & { import: false };

const NONE: Permissions = {
  env: false,
  ffi: false,
  import: false,
  net: false,
  read: false,
  run: false,
  sys: false,
  write: false,
};

/**
 * The permissions for `argv` (main.ts's arguments). Flags this cannot parse grant nothing: the command itself then
 * reports them properly.
 */
export function commandPermissions(argv: string[], facts: Facts): Permissions {
  const [first] = argv;
  const command = first && !first.startsWith("-") ? first : "run";
  const args = command === first ? argv.slice(1) : argv;
  const flags = lenient(args);
  const base: Permissions = { ...NONE, read: [facts.code] };
  // what src/cli/main.ts answers before running anything
  if (command !== "render" && command !== "doctor" && argv.some((a) => ["--version", "--help", "-h"].includes(a))) {
    return base;
  }
  switch (command) {
    case "run": {
      const kube = kubeAccess(flags.string("kubeconfig"), facts);
      const listen = ["health-probe-bind-address", "metrics-bind-address"].flatMap((f) => {
        const addr = bindGrant(flags.string(f) ?? { "health-probe-bind-address": ":8081" }[f] ?? "0");
        return addr ? [addr] : [];
      });
      return {
        ...base,
        env: [...CLIENT_ENV, "NAMESPACE", LAB_HOSTS_ENV, ...YAML_ENV],
        // the leader election identity
        sys: ["hostname"],
        net: [...kube.net, ...listen, ...labHosts(flags.string("lab-hosts"), flags.strings("host-alias"), facts)],
        read: [facts.code, ...kube.read],
        run: kube.run,
      };
    }
    case "render":
      // `-f -` is stdin, which needs no grant
      return {
        ...base,
        env: YAML_ENV,
        read: [facts.code, ...["class", "set", "file", "f"].flatMap((f) => flags.strings(f)).filter((p) => p !== "-")],
      };
    case "doctor": {
      const host = flags.string("host");
      if (host !== undefined) {
        const port = flags.string("port") ?? "22";
        const dial = flags.string("address") ?? host;
        const knownHosts = flags.string("known-hosts") ?? (facts.home && `${facts.home}/.ssh/known_hosts`);
        return {
          ...base,
          env: ["LC_ALL", "LC_CTYPE", "LANG", "HOME", ...YAML_ENV],
          sys: ["homedir"],
          net: [netAddress(dial, port)],
          read: [facts.code, ...[flags.string("key"), knownHosts].filter((p): p is string => !!p)],
        };
      }
      const kube = kubeAccess(flags.string("kubeconfig"), facts);
      return {
        ...base,
        env: [...CLIENT_ENV, LAB_HOSTS_ENV, ...YAML_ENV],
        sys: ["homedir"],
        net: [...kube.net, ...labHosts(undefined, flags.strings("host-alias"), facts)],
        read: [facts.code, ...kube.read],
        run: kube.run,
      };
    }
    default:
      // crds, version, help, and unknown commands (which only print their usage error)
      return base;
  }
}

function labHosts(flag: string | undefined, aliases: string[], facts: Facts): string[] {
  try {
    return labHostGrants(
      parseLabHosts(flag ?? (facts.env[LAB_HOSTS_ENV] || DEFAULT_LAB_HOSTS)),
      parseHostAliases(aliases),
    );
  } catch {
    return [];
  }
}

function bindGrant(addr: string): string | undefined {
  try {
    const a = parseBindAddress(addr);
    return a && netAddress(a.hostname, a.port);
  } catch {
    return undefined;
  }
}

interface KubeAccess {
  net: string[];
  read: string[];
  run: string[] | false;
}

/**
 * Where src/kube/kubeconfig.ts will find its configuration, in its order (--kubeconfig, every file of $KUBECONFIG,
 * in-cluster, ~/.kube/config), and what connecting with it takes: the server, a proxy (the kubeconfig's or the
 * environment's), files, an exec plugin.
 */
export function kubeAccess(flag: string | undefined, facts: Facts): KubeAccess {
  const host = facts.env.KUBERNETES_SERVICE_HOST;
  const port = facts.env.KUBERNETES_SERVICE_PORT;
  const home = facts.home && `${facts.home.replace(/\/$/, "")}/.kube/config`;
  const files = flag !== undefined
    ? [flag]
    : facts.env.KUBECONFIG
    ? facts.env.KUBECONFIG.split(":").filter(Boolean)
    : host && port
    ? []
    : home
    ? [home]
    : [];
  if (files.length === 0) {
    const server = host && port ? `https://${netAddress(host, port)}` : undefined;
    return {
      net: server ? [hostPort(server), ...envProxy(server, facts)] : [],
      read: [SERVICE_ACCOUNT_DIR],
      run: false,
    };
  }
  const access: KubeAccess = { net: [], read: [...files], run: false };
  for (const path of files) {
    const text = facts.readFile(path);
    if (text === undefined) continue; // the client says it is missing
    try {
      const needs = kubeconfigNeeds(text, path);
      access.net.push(needs.server, ...(needs.proxy ? [needs.proxy] : envProxy(`https://${needs.server}`, facts)));
      access.read.push(...needs.files);
      if (needs.exec) access.run = [...(access.run || []), needs.exec];
    } catch {
      // a kubeconfig that does not parse is the client's to report
    }
  }
  return access;
}

function envProxy(server: string, facts: Facts): string[] {
  const proxy = proxyFromEnvironment(server, (n) => facts.env[n]);
  return proxy ? [hostPort(proxy)] : [];
}

/** The flags of any command, without knowing them: `--name value`, `--name=value`, `-f value`. */
function lenient(args: string[]) {
  const { tokens } = parseArgs({ args, strict: false, allowPositionals: true, tokens: true });
  const values = new Map<string, string[]>();
  for (let i = 0; i < tokens.length; i++) {
    const t = tokens[i];
    if (t.kind !== "option") continue;
    let value = t.value;
    const next = tokens[i + 1];
    if (value === undefined && next?.kind === "positional") {
      value = next.value;
      i++;
    }
    if (value !== undefined) values.set(t.name, [...(values.get(t.name) ?? []), value]);
  }
  return {
    string: (name: string) => values.get(name)?.at(-1),
    strings: (name: string) => values.get(name) ?? [],
  };
}
