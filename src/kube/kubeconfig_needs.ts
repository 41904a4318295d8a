/**
 * Kubeconfig files read the way client-go reads them, _pure_ (no file, network or environment access): merging of a
 * $KUBECONFIG list, the context to use, relative paths resolved against the directory of the file that names them,
 * and errors that name the file, the context and the fix. `kubeconfig.ts` reads the files and credentials the result
 * names, and `transport.ts` connects with it; `kubeconfigNeeds` tells a permission set what connecting will touch.
 */
import { parse } from "yaml";

/** Where a pod's service account token and CA are mounted. */
export const SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount";

/** A kubeconfig that cannot be used; the message is one line naming the file, the context and the fix. */
export class KubeconfigError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "KubeconfigError";
  }
}

export interface KubeconfigFile {
  text: string;
  /** Where the text came from: relative paths inside it are resolved against its directory. */
  path: string;
}

export interface ExecConfig {
  /** As written, or resolved against the kubeconfig's directory when it is a relative path with a slash. */
  command: string;
  args: string[];
  env: { name: string; value: string }[];
  apiVersion: string;
  provideClusterInfo: boolean;
  interactiveMode?: string;
  installHint?: string;
  /** The cluster's `extensions` entry `client.authentication.k8s.io/exec`, passed on with provideClusterInfo. */
  clusterConfig?: unknown;
}

/** Everything connecting needs, from one context; file paths absolute, nothing read yet. */
export interface KubeconfigConnection {
  /** The file that holds the context (the first of a $KUBECONFIG list otherwise). */
  path: string;
  context: string;
  cluster: string;
  user: string;
  namespace?: string;
  /** `https://host:port` (no trailing slash); a scheme-less `host:port` is taken as https. */
  server: string;
  caData?: string; // PEM, decoded
  caFile?: string;
  insecureSkipTlsVerify: boolean;
  tlsServerName?: string;
  proxyUrl?: string;
  certData?: string; // PEM, decoded
  certFile?: string;
  keyData?: string; // PEM, decoded
  keyFile?: string;
  token?: string;
  tokenFile?: string;
  username?: string;
  password?: string;
  exec?: ExecConfig;
  impersonate?: { user?: string; uid?: string; groups?: string[] };
}

export interface KubeconfigNeeds {
  /** host:port of the API server, IPv6 in brackets, the scheme's default port when none is written. */
  server: string;
  /** host:port of `proxy-url`. */
  proxy?: string;
  /** certificate-authority, client-certificate, client-key and tokenFile, absolute. */
  files: string[];
  /** The exec credential plugin's command. */
  exec?: string;
}

/** What connecting with `context` (default: current-context) of this kubeconfig reads and dials. */
export function kubeconfigNeeds(text: string, path: string, context?: string): KubeconfigNeeds {
  const c = resolveKubeconfig([{ text, path }], context);
  const files = [c.caFile, c.certFile, c.keyFile, c.token ? undefined : c.tokenFile]
    .filter((f): f is string => f !== undefined);
  return {
    server: hostPort(c.server),
    ...(c.proxyUrl ? { proxy: hostPort(c.proxyUrl) } : {}),
    files: [...new Set(files)],
    ...(c.exec ? { exec: c.exec.command } : {}),
  };
}

interface Named {
  name: string;
  value: Record<string, unknown>;
  /** The file that defines it, for relative paths. */
  path: string;
}

/**
 * One connection from one or more kubeconfig files (a $KUBECONFIG list), merged like client-go: the first file that
 * names a cluster, user or context wins, and so does the first current-context.
 */
export function resolveKubeconfig(files: KubeconfigFile[], context?: string): KubeconfigConnection {
  if (files.length === 0) throw new KubeconfigError("no kubeconfig file given");
  const clusters = new Map<string, Named>();
  const users = new Map<string, Named>();
  const contexts = new Map<string, Named>();
  let current: string | undefined;
  let currentFrom = files[0].path;
  for (const f of files) {
    let doc: unknown;
    try {
      doc = parse(f.text);
    } catch (e) {
      throw new KubeconfigError(`kubeconfig ${f.path} is not valid YAML: ${oneLine(e)}`);
    }
    if (doc === null || doc === undefined) continue; // an empty file is an empty config
    if (typeof doc !== "object" || Array.isArray(doc)) {
      throw new KubeconfigError(
        `kubeconfig ${f.path} is not a kubeconfig (a YAML mapping with clusters, users, contexts)`,
      );
    }
    const d = doc as Record<string, unknown>;
    collect(clusters, d.clusters, "cluster", f.path);
    collect(users, d.users, "user", f.path);
    collect(contexts, d.contexts, "context", f.path);
    if (current === undefined && typeof d["current-context"] === "string" && d["current-context"] !== "") {
      current = d["current-context"];
      currentFrom = f.path;
    }
  }
  const where = files.length === 1 ? files[0].path : files.map((f) => f.path).join(":");
  const known = () => contexts.size ? `contexts: ${[...contexts.keys()].join(", ")}` : "it defines no contexts";
  const name = context ?? current;
  if (!name) {
    throw new KubeconfigError(
      `kubeconfig ${where} has no current-context (${known()}): run \`kubectl config use-context NAME\``,
    );
  }
  const ctx = contexts.get(name);
  if (!ctx) {
    const how = context ? "" : `current-context of ${currentFrom}, `;
    throw new KubeconfigError(
      `kubeconfig ${where}: context "${name}" (${how}${known()}) does not exist: ` +
        "run `kubectl config use-context NAME` with one of them",
    );
  }
  const path = ctx.path;
  const clusterName = str(ctx.value.cluster);
  if (!clusterName) throw new KubeconfigError(`kubeconfig ${path}: context "${name}" names no cluster`);
  const cl = clusters.get(clusterName);
  if (!cl) {
    throw new KubeconfigError(
      `kubeconfig ${where}: context "${name}" uses cluster "${clusterName}", which is not in clusters: add it or fix the context`,
    );
  }
  const userName = str(ctx.value.user) ?? "";
  const us = userName ? users.get(userName) : undefined;
  if (userName && !us) {
    throw new KubeconfigError(
      `kubeconfig ${where}: context "${name}" uses user "${userName}", which is not in users: add it or fix the context`,
    );
  }
  const c = cl.value;
  const rawServer = str(c.server);
  if (!rawServer) {
    throw new KubeconfigError(`kubeconfig ${cl.path}: cluster "${clusterName}" (context "${name}") has no server`);
  }
  const server = (rawServer.includes("://") ? rawServer : `https://${rawServer}`).replace(/\/+$/, "");
  try {
    const u = new URL(server);
    if (u.protocol !== "https:" && u.protocol !== "http:") throw new Error(`scheme ${u.protocol} is not http or https`);
  } catch (e) {
    throw new KubeconfigError(
      `kubeconfig ${cl.path}: cluster "${clusterName}" (context "${name}") has an invalid server ${rawServer}: ${
        oneLine(e)
      }`,
    );
  }
  const proxyUrl = str(c["proxy-url"]);
  if (proxyUrl) {
    let scheme = "";
    try {
      scheme = new URL(proxyUrl).protocol;
    } catch { /* reported below */ }
    if (!["http:", "https:", "socks5:", "socks5h:"].includes(scheme)) {
      throw new KubeconfigError(
        `kubeconfig ${cl.path}: cluster "${clusterName}" (context "${name}") has proxy-url ${proxyUrl}: ` +
          "use an http://, https:// or socks5:// URL",
      );
    }
  }
  const u = us?.value ?? {};
  const upath = us?.path ?? path;
  const data = (v: unknown, field: string, owner: string) => {
    const s = str(v);
    if (s === undefined) return undefined;
    try {
      return new TextDecoder().decode(Uint8Array.from(atob(s.replace(/\s+/g, "")), (ch) => ch.charCodeAt(0)));
    } catch {
      throw new KubeconfigError(
        `kubeconfig ${path}: ${field} of ${owner} is not base64: encode the PEM with base64 -w0`,
      );
    }
  };
  const clusterOwner = `cluster "${clusterName}"`;
  const userOwner = `user "${userName}"`;
  const as = str(u.as);
  const asUid = str(u["as-uid"]);
  const asGroups = Array.isArray(u["as-groups"]) ? (u["as-groups"] as unknown[]).map(String) : undefined;
  const conn: KubeconfigConnection = {
    path,
    context: name,
    cluster: clusterName,
    user: userName,
    namespace: str(ctx.value.namespace),
    server,
    insecureSkipTlsVerify: c["insecure-skip-tls-verify"] === true,
  };
  const set = <K extends keyof KubeconfigConnection>(k: K, v: KubeconfigConnection[K] | undefined) => {
    if (v !== undefined) conn[k] = v;
  };
  set("caData", data(c["certificate-authority-data"], "certificate-authority-data", clusterOwner));
  if (!conn.caData) set("caFile", resolvePath(str(c["certificate-authority"]), cl.path));
  set("tlsServerName", str(c["tls-server-name"]));
  set("proxyUrl", proxyUrl);
  set("certData", data(u["client-certificate-data"], "client-certificate-data", userOwner));
  if (!conn.certData) set("certFile", resolvePath(str(u["client-certificate"]), upath));
  set("keyData", data(u["client-key-data"], "client-key-data", userOwner));
  if (!conn.keyData) set("keyFile", resolvePath(str(u["client-key"]), upath));
  set("token", str(u.token));
  // client-go's field is tokenFile; client-node wrote token-file, which some kubeconfigs still carry
  set("tokenFile", resolvePath(str(u.tokenFile) ?? str(u["token-file"]), upath));
  set("username", str(u.username));
  set("password", str(u.password));
  if (as || asUid || asGroups) conn.impersonate = { user: as, uid: asUid, groups: asGroups };
  if ((conn.certData || conn.certFile) && !(conn.keyData || conn.keyFile)) {
    throw new KubeconfigError(
      `kubeconfig ${upath}: user "${userName}" (context "${name}") has a client certificate but no client-key(-data)`,
    );
  }
  if (u["auth-provider"] !== undefined && u["auth-provider"] !== null) {
    const p = (u["auth-provider"] as { name?: string }).name ?? "?";
    throw new KubeconfigError(
      `kubeconfig ${upath}: user "${userName}" (context "${name}") uses auth-provider "${p}", which this client does ` +
        "not support: use an exec credential plugin (e.g. kubelogin) instead",
    );
  }
  if (u.exec !== undefined && u.exec !== null) conn.exec = execConfig(u.exec, upath, userName, name, c);
  return conn;
}

function execConfig(
  raw: unknown,
  path: string,
  user: string,
  context: string,
  cluster: Record<string, unknown>,
): ExecConfig {
  const e = raw as Record<string, unknown>;
  const command = str(e.command);
  if (!command) throw new KubeconfigError(`kubeconfig ${path}: the exec plugin of user "${user}" has no command`);
  const apiVersion = str(e.apiVersion);
  if (!apiVersion) {
    throw new KubeconfigError(
      `kubeconfig ${path}: the exec plugin of user "${user}" (context "${context}") has no apiVersion: ` +
        "set client.authentication.k8s.io/v1",
    );
  }
  const extensions = Array.isArray(cluster.extensions)
    ? cluster.extensions as { name?: string; extension?: unknown }[]
    : [];
  return {
    // client-go: a relative command with a path separator is relative to the kubeconfig; a bare name is looked up in PATH
    command: command.includes("/") ? resolvePath(command, path)! : command,
    args: Array.isArray(e.args) ? e.args.map(String) : [],
    env: Array.isArray(e.env)
      ? (e.env as { name?: unknown; value?: unknown }[]).map((v) => ({ name: String(v.name), value: String(v.value) }))
      : [],
    apiVersion,
    provideClusterInfo: e.provideClusterInfo === true,
    interactiveMode: str(e.interactiveMode),
    installHint: str(e.installHint),
    clusterConfig: extensions.find((x) => x.name === "client.authentication.k8s.io/exec")?.extension,
  };
}

function collect(into: Map<string, Named>, list: unknown, key: string, path: string) {
  if (list === undefined || list === null) return;
  if (!Array.isArray(list)) throw new KubeconfigError(`kubeconfig ${path}: ${key}s is not a list`);
  for (const [i, item] of list.entries()) {
    const name = str(item?.name);
    if (!name) throw new KubeconfigError(`kubeconfig ${path}: ${key}s[${i}] has no name`);
    if (!into.has(name)) into.set(name, { name, value: (item[key] ?? {}) as Record<string, unknown>, path });
  }
}

/** `host:port` of an http(s) or socks URL, IPv6 in brackets, the scheme's default port when none is written. */
export function hostPort(url: string): string {
  const u = new URL(url.includes("://") ? url : `https://${url}`);
  const defaults: Record<string, string> = { "https:": "443", "http:": "80", "socks5:": "1080", "socks5h:": "1080" };
  return `${u.hostname}:${u.port || defaults[u.protocol] || "443"}`;
}

/** A path from a kubeconfig, absolute: relative ones are relative to the kubeconfig's directory, like client-go. */
export function resolvePath(p: string | undefined, kubeconfigPath: string): string | undefined {
  if (!p) return undefined;
  if (p.startsWith("/")) return p;
  const dir = kubeconfigPath.includes("/") ? kubeconfigPath.slice(0, kubeconfigPath.lastIndexOf("/")) || "/" : ".";
  const joined = `${dir}/${p}`;
  const abs = joined.startsWith("/");
  const out: string[] = [];
  for (const seg of joined.split("/")) {
    if (seg === "" || seg === ".") continue;
    if (seg !== "..") out.push(seg);
    else if (out.length && out[out.length - 1] !== "..") out.pop();
    else if (!abs) out.push("..");
  }
  return (abs ? "/" : "") + out.join("/") || (abs ? "/" : ".");
}

/**
 * The proxy for `server` from HTTPS_PROXY / HTTP_PROXY and NO_PROXY (either case), as Go's net/http reads them when a
 * kubeconfig has no proxy-url; undefined = connect directly.
 */
export function proxyFromEnvironment(server: string, env: (name: string) => string | undefined): string | undefined {
  const get = (n: string) => env(n) || env(n.toLowerCase()) || undefined;
  const u = new URL(server);
  const proxy = u.protocol === "https:" ? get("HTTPS_PROXY") : get("HTTP_PROXY");
  if (!proxy) return undefined;
  const host = u.hostname.replace(/^\[|\]$/g, "").toLowerCase();
  const port = u.port || (u.protocol === "https:" ? "443" : "80");
  if (host === "localhost" || host === "::1" || /^127\./.test(host)) return undefined; // Go never proxies loopback
  for (let entry of (get("NO_PROXY") ?? "").split(",").map((s) => s.trim().toLowerCase()).filter(Boolean)) {
    if (entry === "*") return undefined;
    if (entry.includes("/")) {
      if (inCidr(host, entry)) return undefined;
      continue;
    }
    const m = /^(\[[^\]]+\]|[^:]+)(?::(\d+))?$/.exec(entry);
    if (m?.[2] && m[2] !== port) continue;
    entry = (m?.[1] ?? entry).replace(/^\[|\]$/g, "");
    if (host === entry.replace(/^\*?\./, "") || host.endsWith(entry.startsWith(".") ? entry : `.${entry}`)) {
      return undefined;
    }
  }
  return proxy.includes("://") ? proxy : `http://${proxy}`;
}

function inCidr(host: string, cidr: string): boolean {
  const [net, bitsText] = cidr.split("/");
  const a = ipBytes(host);
  const b = ipBytes(net);
  const bits = Number(bitsText);
  if (!a || !b || a.length !== b.length || !Number.isInteger(bits)) return false;
  for (let i = 0; i < bits; i++) {
    const mask = 0x80 >> (i % 8);
    if ((a[i >> 3] & mask) !== (b[i >> 3] & mask)) return false;
  }
  return true;
}

function ipBytes(ip: string): number[] | undefined {
  if (/^\d+\.\d+\.\d+\.\d+$/.test(ip)) {
    const b = ip.split(".").map(Number);
    return b.every((x) => x <= 255) ? b : undefined;
  }
  if (!ip.includes(":")) return undefined;
  const [head, tail = ""] = ip.split("::");
  const h = head ? head.split(":") : [];
  const t = ip.includes("::") ? (tail ? tail.split(":") : []) : [];
  const groups = [...h, ...Array(8 - h.length - t.length).fill("0"), ...t];
  if (groups.length !== 8) return undefined;
  return groups.flatMap((g) => {
    const n = parseInt(g, 16);
    return [n >> 8, n & 255];
  });
}

function str(v: unknown): string | undefined {
  return typeof v === "string" && v !== "" ? v : undefined;
}

function oneLine(e: unknown): string {
  return (e instanceof Error ? e.message : String(e)).split("\n")[0];
}
