import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import { createHash, createHmac, randomBytes } from "node:crypto";
import {
  checkHostKey,
  fingerprint,
  hostsMatch,
  keyType,
  knownHostsLine,
  lookup,
  parseKnownHosts,
} from "./known_hosts.ts";

/** Builds a syntactically valid key blob; the pool only compares blobs, so the key bytes need not be a real key. */
function fakeBlob(type: string, seed: string): string {
  const t = Buffer.from(type);
  const k = createHash("sha256").update(seed).digest();
  const out = Buffer.alloc(8 + t.length + k.length);
  out.writeUInt32BE(t.length, 0);
  t.copy(out, 4);
  out.writeUInt32BE(k.length, 4 + t.length);
  k.copy(out, 8 + t.length);
  return out.toString("base64");
}

function hashedHost(name: string, salt = randomBytes(20)): string {
  const hash = createHmac("sha1", salt).update(name).digest();
  return `|1|${salt.toString("base64")}|${hash.toString("base64")}`;
}

const ED_A = fakeBlob("ssh-ed25519", "a");
const ED_B = fakeBlob("ssh-ed25519", "b");
const RSA_A = fakeBlob("ssh-rsa", "rsa-a");

Deno.test("known_hosts: plain host lists, comments and blank lines", () => {
  const text = [
    "# lab hosts",
    "",
    `lab1.example.com,10.0.0.5 ssh-ed25519 ${ED_A} root@lab1`,
    "   # indented comment",
    `lab2 ssh-rsa ${RSA_A}`,
  ].join("\n");
  assert.deepEqual(lookup(text, "lab1.example.com", 22), { keys: [{ type: "ssh-ed25519", blob: ED_A }], revoked: [] });
  assert.deepEqual(lookup(text, "10.0.0.5", 22).keys.map((k) => k.blob), [ED_A]);
  assert.deepEqual(lookup(text, "LAB1.example.com", 22).keys.map((k) => k.blob), [ED_A], "host names are case-blind");
  assert.deepEqual(lookup(text, "lab2", 22).keys, [{ type: "ssh-rsa", blob: RSA_A }]);
  assert.deepEqual(lookup(text, "lab3", 22), { keys: [], revoked: [] });
  assert.deepEqual(lookup(text, "lab1", 22).keys, [], "no partial-name match");
});

Deno.test("known_hosts: [host]:port entries only match that port", () => {
  const text = `[10.0.0.5]:2222 ssh-ed25519 ${ED_A}\n10.0.0.5 ssh-ed25519 ${ED_B}\n`;
  assert.deepEqual(lookup(text, "10.0.0.5", 2222).keys.map((k) => k.blob), [ED_A]);
  assert.deepEqual(lookup(text, "10.0.0.5", 22).keys.map((k) => k.blob), [ED_B]);
  assert.deepEqual(lookup(text, "10.0.0.5", 2223).keys, []);
  // An explicit [host]:22 is not how OpenSSH writes port 22, so it does not match (same as OpenSSH).
  assert.deepEqual(lookup(`[h]:22 ssh-ed25519 ${ED_A}`, "h", 22).keys, []);
});

Deno.test("known_hosts: hashed |1| entries (HMAC-SHA1), with and without port", () => {
  const text = [
    `${hashedHost("lab1.example.com")} ssh-ed25519 ${ED_A}`,
    `${hashedHost("[10.0.0.5]:2222")} ssh-rsa ${RSA_A}`,
    `|1|bm90IGJhc2U2NCE=|!!! ssh-ed25519 ${ED_B}`, // broken hash: must simply not match
  ].join("\n");
  assert.deepEqual(lookup(text, "lab1.example.com", 22).keys.map((k) => k.blob), [ED_A]);
  assert.deepEqual(lookup(text, "Lab1.Example.com", 22).keys.map((k) => k.blob), [ED_A]);
  assert.deepEqual(lookup(text, "lab1.example.com", 2222).keys, []);
  assert.deepEqual(lookup(text, "10.0.0.5", 2222).keys.map((k) => k.type), ["ssh-rsa"]);
  assert.deepEqual(lookup(text, "10.0.0.5", 22).keys, []);
});

Deno.test("known_hosts: matches lines written by ssh-keygen -H", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const file = `${dir}/known_hosts`;
    await Deno.writeTextFile(file, `lab9 ssh-ed25519 ${ED_A}\n[lab9]:2200 ssh-ed25519 ${ED_B}\n`);
    const r = await new Deno.Command("ssh-keygen", { args: ["-H", "-f", file], stdout: "null", stderr: "null" })
      .output();
    assert.ok(r.success);
    const hashed = await Deno.readTextFile(file);
    assert.ok(!hashed.includes("lab9"), "ssh-keygen -H must have hashed the names");
    assert.deepEqual(lookup(hashed, "lab9", 22).keys.map((k) => k.blob), [ED_A]);
    assert.deepEqual(lookup(hashed, "lab9", 2200).keys.map((k) => k.blob), [ED_B]);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("known_hosts: multiple keys per host, duplicates collapsed", () => {
  const text = `h ssh-ed25519 ${ED_A}\nh,other ssh-rsa ${RSA_A}\nh ssh-ed25519 ${ED_A}\n`;
  assert.deepEqual(lookup(text, "h", 22).keys, [
    { type: "ssh-ed25519", blob: ED_A },
    { type: "ssh-rsa", blob: RSA_A },
  ]);
});

Deno.test("known_hosts: @revoked removes a key and @cert-authority is ignored", () => {
  const text = [
    `h ssh-ed25519 ${ED_A}`,
    `h ssh-ed25519 ${ED_B}`,
    `@revoked * ssh-ed25519 ${ED_A}`,
    `@cert-authority *.example.com ssh-rsa ${RSA_A}`,
  ].join("\n");
  const r = lookup(text, "h", 22);
  assert.deepEqual(r.keys.map((k) => k.blob), [ED_B]);
  assert.deepEqual(r.revoked.map((k) => k.blob), [ED_A]);
  assert.deepEqual(lookup(text, "x.example.com", 22), { keys: [], revoked: [{ type: "ssh-ed25519", blob: ED_A }] });

  assert.equal(checkHostKey(text, "h", 22, ED_A).status, "revoked");
  assert.equal(checkHostKey(text, "h", 22, ED_B).status, "match");
  assert.equal(checkHostKey(text, "x.example.com", 22, RSA_A).status, "unknown", "a CA key is not a host key");
});

Deno.test("known_hosts: wildcard and negated patterns", () => {
  assert.ok(hostsMatch("*.lab.example.com", "h1.lab.example.com"));
  assert.ok(hostsMatch("h?", "h1"));
  assert.ok(!hostsMatch("h?", "h12"));
  assert.ok(!hostsMatch("*.lab.example.com,!h2.lab.example.com", "h2.lab.example.com"));
  assert.ok(hostsMatch("*.lab.example.com,!h2.lab.example.com", "h3.lab.example.com"));
  assert.ok(hostsMatch("[10.0.0.*]:2222", "[10.0.0.7]:2222"));
  assert.ok(!hostsMatch("!h1", "h1"));
  assert.ok(!hostsMatch("!h1", "h2"), "a negation alone matches nothing");
});

Deno.test("known_hosts: bad lines are reported and skipped", () => {
  const text = [
    `good ssh-ed25519 ${ED_A}`,
    "short ssh-ed25519",
    "badb64 ssh-ed25519 ***",
    `mismatch ssh-rsa ${ED_A}`,
    `@bogus h ssh-ed25519 ${ED_A}`,
  ].join("\r\n");
  const p = parseKnownHosts(text);
  assert.deepEqual(p.entries.map((e) => e.hosts), ["good"]);
  assert.deepEqual(p.invalid.map((i) => i.line), [2, 3, 4, 5]);
  assert.match(p.invalid[2].reason, /does not match/);
});

Deno.test("known_hosts: checkHostKey verdicts name expected fingerprints", () => {
  const text = `h ssh-ed25519 ${ED_A}\nh ssh-rsa ${RSA_A}\n`;
  assert.deepEqual(checkHostKey(text, "h", 22, Buffer.from(ED_A, "base64")), {
    status: "match",
    fingerprint: fingerprint(ED_A),
  });
  const v = checkHostKey(text, "h", 22, ED_B);
  assert.equal(v.status, "mismatch");
  assert.ok(v.status === "mismatch");
  assert.deepEqual(v.expected, [`ssh-ed25519 ${fingerprint(ED_A)}`, `ssh-rsa ${fingerprint(RSA_A)}`]);
  assert.equal(v.fingerprint, fingerprint(ED_B));
  assert.equal(checkHostKey(text, "h", 2222, ED_A).status, "unknown");
  assert.equal(checkHostKey("", "h", 22, ED_A).status, "unknown");
});

Deno.test("known_hosts: fingerprint matches ssh-keygen -lf", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const key = `${dir}/k`;
    const gen = await new Deno.Command("ssh-keygen", { args: ["-q", "-t", "ed25519", "-N", "", "-f", key] }).output();
    assert.ok(gen.success);
    const [type, b64] = (await Deno.readTextFile(`${key}.pub`)).trim().split(" ");
    const out = await new Deno.Command("ssh-keygen", { args: ["-l", "-E", "sha256", "-f", `${key}.pub`] }).output();
    const want = new TextDecoder().decode(out.stdout).split(" ")[1];
    assert.equal(fingerprint(b64), want);
    assert.ok(!fingerprint(b64).endsWith("="), "OpenSSH fingerprints carry no base64 padding");
    assert.equal(keyType(Buffer.from(b64, "base64")), type);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("known_hosts: knownHostsLine round-trips through lookup", () => {
  const blob = Buffer.from(ED_A, "base64");
  assert.equal(knownHostsLine("Lab1", 22, blob), `lab1 ssh-ed25519 ${ED_A}`);
  const line = knownHostsLine("10.0.0.5", 2222, ED_A);
  assert.equal(line, `[10.0.0.5]:2222 ssh-ed25519 ${ED_A}`);
  assert.equal(checkHostKey(line, "10.0.0.5", 2222, blob).status, "match");
});

Deno.test("known_hosts: keyType rejects malformed blobs", () => {
  assert.throws(() => keyType(new Uint8Array([0, 0])));
  assert.throws(() => keyType(new Uint8Array([0, 0, 0, 9, 65])));
  assert.throws(() => keyType(new Uint8Array([0, 0, 0, 0])));
  assert.equal(keyType(RSA_A), "ssh-rsa");
});
