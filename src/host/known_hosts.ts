/**
 * OpenSSH known_hosts handling for the SSH pool. ssh2 never reads known_hosts itself (its `hostVerifier` only gets
 * the raw key blob), so matching a presented host key against the text from a Secret is done here.
 *
 * Pure: no I/O, only node:crypto for SHA-256 fingerprints and the HMAC-SHA1 of hashed (`|1|salt|hash`) entries.
 */
import { createHash, createHmac, timingSafeEqual } from "node:crypto";
import { Buffer } from "node:buffer";

/** A host key as recorded in known_hosts: algorithm name plus the base64 wire blob. */
export interface HostKey {
  type: string;
  /** Canonical base64 (with padding) of the SSH wire-format public key blob. */
  blob: string;
}

export interface KnownHostsEntry {
  /** 1-based line number, so error messages can point at the offending line of the Secret. */
  line: number;
  marker?: "revoked" | "cert-authority";
  /** The host field as written (comma separated patterns, or one `|1|salt|hash`). */
  hosts: string;
  key: HostKey;
}

export interface KnownHostsParseResult {
  entries: KnownHostsEntry[];
  /** Lines that could not be used, with the reason; reported rather than thrown so one bad line does not hide the rest. */
  invalid: { line: number; reason: string }[];
}

export interface LookupResult {
  /** Keys that are trusted for the host (revoked keys removed). */
  keys: HostKey[];
  /** Keys marked `@revoked` for the host: never accept these, even if also listed as trusted. */
  revoked: HostKey[];
}

/**
 * Every command to every host is checked against its credentials Secret's known_hosts, one text for a whole lab:
 * parsing it each time cost 10% of the controller's steady-state CPU at 500 hosts. The few recent texts stay parsed.
 */
const recentlyParsed = new Map<string, KnownHostsParseResult>();
const RECENT_TEXTS = 16;

function parsedOnce(text: string): KnownHostsParseResult {
  let parsed = recentlyParsed.get(text);
  if (parsed) recentlyParsed.delete(text); // re-inserted below: the Map's order is the recency
  else parsed = parseKnownHosts(text);
  recentlyParsed.set(text, parsed);
  if (recentlyParsed.size > RECENT_TEXTS) recentlyParsed.delete(recentlyParsed.keys().next().value!);
  return parsed;
}

export function parseKnownHosts(text: string): KnownHostsParseResult {
  const entries: KnownHostsEntry[] = [];
  const invalid: { line: number; reason: string }[] = [];
  const lines = text.split(/\r?\n/);
  for (let i = 0; i < lines.length; i++) {
    const raw = lines[i].trim();
    if (raw === "" || raw.startsWith("#")) continue;
    const fields = raw.split(/\s+/);
    let marker: KnownHostsEntry["marker"];
    if (fields[0].startsWith("@")) {
      const m = fields.shift()!;
      if (m === "@revoked") marker = "revoked";
      else if (m === "@cert-authority") marker = "cert-authority";
      else {
        invalid.push({ line: i + 1, reason: `unknown marker ${m}` });
        continue;
      }
    }
    if (fields.length < 3) {
      invalid.push({ line: i + 1, reason: "expected: [marker] hosts key-type base64-key [comment]" });
      continue;
    }
    const [hosts, type, b64] = fields;
    let blob: Buffer;
    try {
      blob = decodeBase64Strict(b64);
    } catch {
      invalid.push({ line: i + 1, reason: "key is not valid base64" });
      continue;
    }
    let blobType: string;
    try {
      blobType = keyType(blob);
    } catch (e) {
      invalid.push({ line: i + 1, reason: (e as Error).message });
      continue;
    }
    // A line whose declared type disagrees with its blob is corrupt (often a bad copy/paste); OpenSSH skips it too.
    if (blobType !== type) {
      invalid.push({ line: i + 1, reason: `key type ${type} does not match the key data (${blobType})` });
      continue;
    }
    entries.push({ line: i + 1, marker, hosts, key: { type, blob: blob.toString("base64") } });
  }
  return { entries, invalid };
}

/**
 * The keys recorded for host:port. Port 22 is looked up as the bare host, any other port as `[host]:port`, which is
 * how OpenSSH writes and hashes them. `@cert-authority` lines are ignored: the pool does not do host certificates.
 */
export function lookup(knownHosts: string | KnownHostsParseResult, host: string, port: number): LookupResult {
  const parsed = typeof knownHosts === "string" ? parsedOnce(knownHosts) : knownHosts;
  const name = hostField(host, port);
  const keys: HostKey[] = [];
  const revoked: HostKey[] = [];
  for (const e of parsed.entries) {
    if (e.marker === "cert-authority") continue;
    if (!hostsMatch(e.hosts, name)) continue;
    const list = e.marker === "revoked" ? revoked : keys;
    if (!list.some((k) => k.blob === e.key.blob)) list.push(e.key);
  }
  return { keys: keys.filter((k) => !revoked.some((r) => r.blob === k.blob)), revoked };
}

/** OpenSSH-style `SHA256:` fingerprint (unpadded base64) of a key blob given as bytes or base64. */
export function fingerprint(blob: Uint8Array | string): string {
  const bytes = typeof blob === "string" ? decodeBase64Strict(blob) : blob;
  return "SHA256:" + createHash("sha256").update(bytes).digest("base64").replace(/=+$/, "");
}

/** A plain (unhashed) known_hosts line for the key, suitable for pinning in a Secret or status field. */
export function knownHostsLine(host: string, port: number, keyBlob: Uint8Array | string): string {
  const bytes = typeof keyBlob === "string" ? decodeBase64Strict(keyBlob) : keyBlob;
  return `${hostField(host, port)} ${keyType(bytes)} ${Buffer.from(bytes).toString("base64")}`;
}

/** The algorithm name at the start of an SSH wire-format public key blob (e.g. `ssh-ed25519`). */
export function keyType(blob: Uint8Array | string): string {
  const bytes = typeof blob === "string" ? decodeBase64Strict(blob) : blob;
  if (bytes.length < 4) throw new Error("key data too short");
  const len = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength).getUint32(0);
  if (len === 0 || len > 64 || 4 + len > bytes.length) throw new Error("key data has no valid key type");
  const type = new TextDecoder().decode(bytes.subarray(4, 4 + len));
  if (!/^[\x21-\x7e]+$/.test(type)) throw new Error("key data has no valid key type");
  return type;
}

/** Host name as it appears in known_hosts: lower-cased, and bracketed with the port when the port is not 22. */
export function hostField(host: string, port: number): string {
  const h = host.toLowerCase();
  return port === 22 ? h : `[${h}]:${port}`;
}

/**
 * Matches a known_hosts host field against a host name. Follows OpenSSH: comma separated patterns with `*` and `?`
 * wildcards, a matching `!pattern` vetoes the whole line, and a single `|1|salt|hash` field is HMAC-SHA1(salt, name).
 */
export function hostsMatch(hosts: string, name: string): boolean {
  if (hosts.startsWith("|1|")) return hashedMatch(hosts, name);
  let matched = false;
  for (const raw of hosts.split(",")) {
    if (raw === "") continue;
    const negated = raw.startsWith("!");
    const pattern = (negated ? raw.slice(1) : raw).toLowerCase();
    if (!globMatch(pattern, name)) continue;
    if (negated) return false;
    matched = true;
  }
  return matched;
}

function hashedMatch(field: string, name: string): boolean {
  const parts = field.split("|");
  // "|1|salt|hash" splits into ["", "1", salt, hash]
  if (parts.length !== 4) return false;
  let salt: Buffer, want: Buffer;
  try {
    salt = decodeBase64Strict(parts[2]);
    want = decodeBase64Strict(parts[3]);
  } catch {
    return false;
  }
  const got = createHmac("sha1", salt).update(name).digest();
  return got.length === want.length && timingSafeEqual(got, want);
}

function globMatch(pattern: string, text: string): boolean {
  // Iterative wildcard match with backtracking on the last `*`; patterns are tiny so this is plenty.
  let p = 0, t = 0, star = -1, mark = 0;
  while (t < text.length) {
    if (p < pattern.length && (pattern[p] === "?" || pattern[p] === text[t])) {
      p++;
      t++;
    } else if (p < pattern.length && pattern[p] === "*") {
      star = p++;
      mark = t;
    } else if (star !== -1) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.length && pattern[p] === "*") p++;
  return p === pattern.length;
}

/** Node's base64 decoder silently skips junk; known_hosts data must be rejected instead of half-decoded. */
function decodeBase64Strict(s: string): Buffer {
  if (!/^[A-Za-z0-9+/]+={0,2}$/.test(s)) throw new Error("invalid base64");
  const b = Buffer.from(s, "base64");
  if (b.length === 0) throw new Error("invalid base64");
  return b;
}

export type HostKeyVerdict =
  /** The presented key is recorded for the host. */
  | { status: "match"; fingerprint: string }
  /** The presented key is marked `@revoked` for the host. */
  | { status: "revoked"; fingerprint: string }
  /** Keys are recorded for the host but the presented one is not among them: possible impersonation or a rebuilt host. */
  | { status: "mismatch"; fingerprint: string; expected: string[] }
  /** Nothing recorded for the host. */
  | { status: "unknown"; fingerprint: string };

/**
 * Decides what known_hosts says about a presented host key. `expected` lists `type fingerprint` of the recorded keys so a
 * refusal can show both sides. The policy for "unknown" (refuse or trust on first use) belongs to the caller.
 */
export function checkHostKey(
  knownHosts: string | KnownHostsParseResult,
  host: string,
  port: number,
  presented: Uint8Array | string,
): HostKeyVerdict {
  const bytes = typeof presented === "string" ? decodeBase64Strict(presented) : presented;
  const blob = Buffer.from(bytes).toString("base64");
  const fp = fingerprint(bytes);
  const found = lookup(knownHosts, host, port);
  if (found.revoked.some((k) => k.blob === blob)) return { status: "revoked", fingerprint: fp };
  if (found.keys.some((k) => k.blob === blob)) return { status: "match", fingerprint: fp };
  // Revoked-only hosts count as unknown, as in OpenSSH: a revocation says what not to trust, not what to expect.
  if (found.keys.length > 0) {
    return { status: "mismatch", fingerprint: fp, expected: found.keys.map((k) => `${k.type} ${fingerprint(k.blob)}`) };
  }
  return { status: "unknown", fingerprint: fp };
}
