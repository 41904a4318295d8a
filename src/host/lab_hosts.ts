/**
 * Which lab hosts this controller may reach, and where a lab host's name is reached: `--lab-hosts` and
 * `--host-alias`. The list becomes the Deno network permission of the controller (src/cli/permissions.ts), so a
 * VirtualTargetClass cannot point the controller at anything the deployment did not name. Light on purpose (no npm
 * import): the launcher, which runs with the broad permissions, imports it (main.ts).
 */

/** The RFC 1918 ranges on port 22: a lab on a private network works without configuring anything. */
export const DEFAULT_LAB_HOSTS = "10.0.0.0/8:22,172.16.0.0/12:22,192.168.0.0/16:22";

/** The environment variable a Deployment sets instead of the flag (the operator passes its own flags). */
export const LAB_HOSTS_ENV = "LAB_HOSTS";

export interface LabHostEntry {
  /** A host name, an IPv4 address or range (CIDR), or an IPv6 address without brackets. */
  host: string;
  /** undefined: any port. */
  port?: number;
}

/**
 * Parses `NAME[:PORT]`, `ADDRESS[:PORT]`, `CIDR[:PORT]` or `[IPV6][:PORT]`, comma-separated; throws naming the bad
 * entry. Deno matches IPv6 addresses but no IPv6 ranges, so neither does this.
 */
export function parseLabHosts(list: string): LabHostEntry[] {
  const entries = list.split(",").map((s) => s.trim()).filter(Boolean);
  if (!entries.length) throw new Error(`--lab-hosts: the list is empty (give host names, addresses or CIDRs)`);
  return entries.map((raw) => {
    const m = /^\[([0-9a-fA-F:.]+)\](?::(\d+))?$/.exec(raw) ?? /^([^:\[\]\s/]+(?:\/\d{1,2})?)(?::(\d+))?$/.exec(raw);
    if (!m) {
      const v6 = raw.includes("/") && raw.split(":").length > 2;
      throw new Error(
        `--lab-hosts: "${raw}" is not HOST, ADDRESS, CIDR or [IPV6], each with an optional :PORT` +
          (v6 ? " (IPv6 ranges cannot be granted: list the addresses)" : ""),
      );
    }
    const port = m[2] ? Number(m[2]) : undefined;
    if (port !== undefined && (port < 1 || port > 65535)) throw new Error(`--lab-hosts: "${raw}": port out of range`);
    if (Number(/\/(\d+)$/.exec(m[1])?.[1] ?? 0) > 32) throw new Error(`--lab-hosts: "${raw}": prefix longer than 32`);
    return { host: m[1], port };
  });
}

/** Parses repeated `NAME=ADDRESS` flags (`--host-alias`) into a map; throws naming the bad one. */
export function parseHostAliases(flags: string[]): Record<string, string> {
  const aliases: Record<string, string> = {};
  for (const a of flags) {
    const m = /^([^=\s]+)=([^=\s]+)$/.exec(a);
    if (!m) throw new Error(`--host-alias must be NAME=ADDRESS, got "${a}"`);
    aliases[m[1]] = m[2];
  }
  return aliases;
}

/**
 * Deno `net` permission entries for the lab hosts. A named host with a `--host-alias` is dialed at its alias
 * address, so that address is granted too, with the same port.
 */
export function labHostGrants(entries: LabHostEntry[], aliases: Record<string, string>): string[] {
  const grant = (host: string, port?: number) => port === undefined ? bracketed(host) : netAddress(host, port);
  return entries.flatMap((e) => {
    const alias = aliases[e.host];
    return alias === undefined ? [grant(e.host, e.port)] : [grant(e.host, e.port), grant(alias, e.port)];
  });
}

/** `host:port` as Deno's net permission and URLs write it: an IPv6 address in brackets. */
export function netAddress(host: string, port: number | string): string {
  return `${bracketed(host)}:${port}`;
}

function bracketed(host: string): string {
  return host.includes(":") ? `[${host}]` : host;
}
