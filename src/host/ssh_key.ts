/**
 * Early validation of the SSH private key taken from a Secret, so a bad key becomes a readable condition on the
 * resource instead of an obscure ssh2 error at connect time. Only what works reliably with ssh2 under Deno is
 * accepted: unencrypted ed25519 and RSA. ECDSA private keys fail intermittently there (`invalid SEC1 private key`).
 *
 * Pure: parses the text, no I/O. Messages never contain key material.
 */
import { createPrivateKey } from "node:crypto";
import { Buffer } from "node:buffer";
import { fingerprint } from "./known_hosts.ts";

export type PrivateKeyType = "ssh-ed25519" | "ssh-rsa";

export type PrivateKeyCheck =
  | {
    ok: true;
    type: PrivateKeyType;
    /** `SHA256:...` of the public key, for messages and for telling keys apart without exposing them. */
    fingerprint: string;
    /** The public key in authorized_keys form (`type base64`), to tell a person what the host must trust. */
    publicKey: string;
  }
  | { ok: false; reason: string };

const OPENSSH_MAGIC = "openssh-key-v1\0";
// Same floor as OpenSSH's RequiredRSASize default: a shorter key would only fail later, at login.
const MIN_RSA_BITS = 1024;

export function checkPrivateKey(text: string): PrivateKeyCheck {
  if (typeof text !== "string" || text.trim() === "") return fail("the private key is empty");
  const trimmed = text.trim();
  if (!trimmed.includes("\n") && trimmed.includes("\\n")) {
    return fail("the private key contains literal \\n sequences instead of line breaks; store the key file unchanged");
  }
  if (/^(ssh-|ecdsa-sha2-|sk-)\S+ [A-Za-z0-9+/=]+/.test(trimmed)) {
    return fail("this is a public key; the Secret must hold the private key (the file without .pub)");
  }
  if (trimmed.startsWith("PuTTY-User-Key-File")) {
    return fail("PuTTY .ppk keys are not supported; convert with `puttygen KEY.ppk -O private-openssh -o KEY`");
  }
  const pem = /^-----BEGIN ([A-Z0-9 ]+)-----\r?\n([\s\S]*?)\r?\n?-----END \1-----$/.exec(trimmed);
  if (!pem) {
    return fail("not a PEM/OpenSSH private key (expected a -----BEGIN ... PRIVATE KEY----- block with nothing else)");
  }
  const [, label, body] = pem;
  switch (label) {
    case "OPENSSH PRIVATE KEY":
      return checkOpenSsh(body);
    case "RSA PRIVATE KEY":
      return checkPemRsa(trimmed, body);
    case "EC PRIVATE KEY":
      return fail(ECDSA_REASON);
    case "DSA PRIVATE KEY":
      return fail(DSA_REASON);
    case "ENCRYPTED PRIVATE KEY":
      return fail(PASSPHRASE_REASON);
    case "PRIVATE KEY":
      return fail(
        "PKCS#8 keys (BEGIN PRIVATE KEY) are not supported by ssh2; use an OpenSSH-format key " +
          "(`ssh-keygen -t ed25519 -N '' -f KEY`) or convert an RSA key with `openssl rsa -in KEY -traditional`",
      );
    default:
      return fail(`unsupported key block "${label}"; expected an OpenSSH or PEM RSA private key`);
  }
}

const ECDSA_REASON = "ECDSA keys are not supported under Deno's ssh2, use ed25519 or RSA";
const DSA_REASON = "DSA keys are not supported (OpenSSH no longer accepts them), use ed25519 or RSA";
const PASSPHRASE_REASON =
  "the private key is passphrase-protected; the controller cannot prompt for it, so store an unencrypted key " +
  "(remove the passphrase with `ssh-keygen -p -N '' -f KEY`)";

function fail(reason: string): PrivateKeyCheck {
  return { ok: false, reason };
}

function checkOpenSsh(body: string): PrivateKeyCheck {
  const data = decodeBase64Body(body);
  if (!data) return fail("the OpenSSH private key body is not valid base64 (truncated or damaged copy?)");
  const r = new WireReader(data);
  try {
    if (r.bytes(OPENSSH_MAGIC.length).toString("latin1") !== OPENSSH_MAGIC) {
      return fail("the OpenSSH private key has a bad header (damaged copy?)");
    }
    const cipher = r.string().toString();
    const kdf = r.string().toString();
    r.string(); // kdf options
    if (cipher !== "none" || kdf !== "none") return fail(PASSPHRASE_REASON);
    const count = r.uint32();
    if (count !== 1) return fail(`the key file holds ${count} keys; exactly one is supported`);
    const publicBlob = r.string();
    const type = new WireReader(publicBlob).string().toString();
    const unsupported = unsupportedType(type);
    if (unsupported) return fail(unsupported);

    // The public blob alone would pass; walk the private section too, so a truncated paste is caught now.
    const priv = new WireReader(r.string());
    if (priv.uint32() !== priv.uint32()) return fail("the OpenSSH private key is corrupt (check bytes differ)");
    const privType = priv.string().toString();
    if (privType !== type) return fail("the OpenSSH private key is corrupt (public and private parts disagree)");
    if (type === "ssh-ed25519") {
      const pub = priv.string();
      const secret = priv.string();
      if (pub.length !== 32 || secret.length !== 64) return fail("the ed25519 private key is corrupt (bad lengths)");
    } else {
      const n = priv.string();
      for (let i = 0; i < 5; i++) priv.string(); // e, d, iqmp, p, q
      const bits = mpintBits(n);
      if (bits < MIN_RSA_BITS) return fail(rsaTooShort(bits));
    }
    priv.string(); // comment
    return ok(type, publicBlob);
  } catch {
    return fail("the OpenSSH private key is truncated or corrupt (damaged copy?)");
  }
}

function checkPemRsa(whole: string, body: string): PrivateKeyCheck {
  if (/^Proc-Type:\s*4,ENCRYPTED/m.test(body)) return fail(PASSPHRASE_REASON);
  if (/^[A-Za-z-]+:/m.test(body)) return fail("the PEM RSA key has unexpected headers; export it without them");
  let jwk: { n?: string; e?: string };
  try {
    const key = createPrivateKey({ key: whole, format: "pem" });
    if (key.asymmetricKeyType !== "rsa") return fail("the PEM block says RSA but does not hold an RSA key");
    jwk = key.export({ format: "jwk" }) as { n?: string; e?: string };
  } catch {
    return fail("the PEM RSA private key cannot be parsed (truncated or damaged copy?)");
  }
  if (!jwk.n || !jwk.e) return fail("the PEM RSA private key cannot be parsed (no public part)");
  const n = Buffer.from(jwk.n, "base64url");
  const e = Buffer.from(jwk.e, "base64url");
  const bits = mpintBits(n);
  if (bits < MIN_RSA_BITS) return fail(rsaTooShort(bits));
  const blob = Buffer.concat([sshString(Buffer.from("ssh-rsa")), sshString(mpint(e)), sshString(mpint(n))]);
  return ok("ssh-rsa", blob);
}

function ok(type: string, publicBlob: Buffer): PrivateKeyCheck {
  return {
    ok: true,
    type: type as PrivateKeyType,
    fingerprint: fingerprint(publicBlob),
    publicKey: `${type} ${publicBlob.toString("base64")}`,
  };
}

function unsupportedType(type: string): string | undefined {
  if (type === "ssh-ed25519" || type === "ssh-rsa") return undefined;
  if (type.startsWith("ecdsa-sha2-")) return ECDSA_REASON;
  if (type === "ssh-dss") return DSA_REASON;
  if (type.startsWith("sk-")) {
    return "security-key (FIDO, sk-*) keys need a hardware token at every login and cannot be used by a controller; " +
      "use ed25519 or RSA";
  }
  return `key type ${type} is not supported, use ed25519 or RSA`;
}

function rsaTooShort(bits: number): string {
  return `the RSA key has only ${bits} bits; use at least ${MIN_RSA_BITS} bits (or ed25519)`;
}

function decodeBase64Body(body: string): Buffer | undefined {
  const compact = body.replace(/\s+/g, "");
  if (compact === "" || !/^[A-Za-z0-9+/]+={0,2}$/.test(compact)) return undefined;
  return Buffer.from(compact, "base64");
}

function mpintBits(n: Uint8Array): number {
  let i = 0;
  while (i < n.length && n[i] === 0) i++;
  if (i === n.length) return 0;
  return (n.length - i - 1) * 8 + (32 - Math.clz32(n[i]));
}

/** SSH mpint encoding of an unsigned big-endian integer: minimal, with a 0x00 prefix when the top bit is set. */
function mpint(n: Buffer): Buffer {
  let i = 0;
  while (i < n.length - 1 && n[i] === 0) i++;
  const v = n.subarray(i);
  return v[0] & 0x80 ? Buffer.concat([Buffer.from([0]), v]) : v;
}

function sshString(b: Buffer): Buffer {
  const len = Buffer.alloc(4);
  len.writeUInt32BE(b.length);
  return Buffer.concat([len, b]);
}

class WireReader {
  #pos = 0;
  constructor(private readonly buf: Buffer) {}
  bytes(n: number): Buffer {
    if (n < 0 || this.#pos + n > this.buf.length) throw new RangeError("truncated");
    const out = this.buf.subarray(this.#pos, this.#pos + n);
    this.#pos += n;
    return out;
  }
  uint32(): number {
    return this.bytes(4).readUInt32BE(0);
  }
  string(): Buffer {
    return this.bytes(this.uint32());
  }
}
