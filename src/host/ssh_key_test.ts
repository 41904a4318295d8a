import assert from "node:assert/strict";
import { checkPrivateKey } from "./ssh_key.ts";

async function keygen(dir: string, name: string, ...args: string[]): Promise<{ key: string; pub: string }> {
  const file = `${dir}/${name}`;
  const r = await new Deno.Command("ssh-keygen", {
    args: ["-q", "-C", name, "-f", file, ...args],
    stdout: "null",
    stderr: "piped",
  }).output();
  if (!r.success) throw new Error(`ssh-keygen ${args.join(" ")}: ${new TextDecoder().decode(r.stderr)}`);
  return { key: await Deno.readTextFile(file), pub: (await Deno.readTextFile(`${file}.pub`)).trim() };
}

async function sha256Fingerprint(pubFile: string): Promise<string> {
  const r = await new Deno.Command("ssh-keygen", { args: ["-l", "-E", "sha256", "-f", pubFile], stdout: "piped" })
    .output();
  return new TextDecoder().decode(r.stdout).split(" ")[1];
}

/** Keys are generated once for the whole file: RSA generation is the slow part. */
const dir = await Deno.makeTempDir({ prefix: "ssh_key_test" });
const keys = {
  ed25519: await keygen(dir, "ed25519", "-t", "ed25519", "-N", ""),
  rsa: await keygen(dir, "rsa", "-t", "rsa", "-b", "2048", "-N", ""),
  rsaPem: await keygen(dir, "rsa_pem", "-t", "rsa", "-b", "2048", "-N", "", "-m", "PEM"),
  rsaPkcs8: await keygen(dir, "rsa_pkcs8", "-t", "rsa", "-b", "2048", "-N", "", "-m", "PKCS8"),
  ecdsa: await keygen(dir, "ecdsa", "-t", "ecdsa", "-N", ""),
  ecdsaPem: await keygen(dir, "ecdsa_pem", "-t", "ecdsa", "-N", "", "-m", "PEM"),
  encEd25519: await keygen(dir, "enc_ed25519", "-t", "ed25519", "-N", "secret-pass"),
  encRsaPem: await keygen(dir, "enc_rsa_pem", "-t", "rsa", "-b", "2048", "-N", "secret-pass", "-m", "PEM"),
};
const fps = {
  ed25519: await sha256Fingerprint(`${dir}/ed25519.pub`),
  rsa: await sha256Fingerprint(`${dir}/rsa.pub`),
  rsaPem: await sha256Fingerprint(`${dir}/rsa_pem.pub`),
};
globalThis.addEventListener("unload", () => Deno.removeSync(dir, { recursive: true }));

Deno.test("ssh_key: accepts unencrypted ed25519 (OpenSSH format)", () => {
  const r = checkPrivateKey(keys.ed25519.key);
  assert.ok(r.ok, !r.ok ? r.reason : "");
  assert.equal(r.type, "ssh-ed25519");
  assert.equal(r.fingerprint, fps.ed25519);
  assert.equal(r.publicKey, keys.ed25519.pub.split(" ").slice(0, 2).join(" "));
});

Deno.test("ssh_key: accepts unencrypted RSA in OpenSSH and PEM format", () => {
  const a = checkPrivateKey(keys.rsa.key);
  assert.ok(a.ok, !a.ok ? a.reason : "");
  assert.equal(a.type, "ssh-rsa");
  assert.equal(a.fingerprint, fps.rsa);
  assert.ok(keys.rsaPem.key.startsWith("-----BEGIN RSA PRIVATE KEY-----"));
  const b = checkPrivateKey(keys.rsaPem.key);
  assert.ok(b.ok, !b.ok ? b.reason : "");
  assert.equal(b.type, "ssh-rsa");
  assert.equal(b.fingerprint, fps.rsaPem, "public key derived from PEM must match ssh-keygen's");
  assert.equal(b.publicKey, keys.rsaPem.pub.split(" ").slice(0, 2).join(" "));
});

Deno.test("ssh_key: tolerates CRLF and surrounding whitespace from Secret editors", () => {
  const r = checkPrivateKey("\n  " + keys.ed25519.key.replaceAll("\n", "\r\n") + "\n\n");
  assert.ok(r.ok);
});

Deno.test("ssh_key: refuses ECDSA with the Deno ssh2 explanation", () => {
  for (const k of [keys.ecdsa.key, keys.ecdsaPem.key]) {
    const r = checkPrivateKey(k);
    assert.deepEqual(r, { ok: false, reason: "ECDSA keys are not supported under Deno's ssh2, use ed25519 or RSA" });
  }
});

Deno.test("ssh_key: refuses DSA", async () => {
  let dsa: string;
  try {
    dsa = (await keygen(dir, "dsa", "-t", "dsa", "-N", "")).key;
  } catch {
    // Newer ssh-keygen builds cannot make DSA keys any more; the PEM label alone is what is checked then.
    dsa = "-----BEGIN DSA PRIVATE KEY-----\nMIIBuwIBAAKBgQD=\n-----END DSA PRIVATE KEY-----\n";
  }
  const r = checkPrivateKey(dsa);
  assert.ok(!r.ok);
  assert.match(r.reason, /DSA keys are not supported/);
});

Deno.test("ssh_key: refuses passphrase-protected keys and says how to fix it", () => {
  for (const k of [keys.encEd25519.key, keys.encRsaPem.key]) {
    const r = checkPrivateKey(k);
    assert.ok(!r.ok);
    assert.match(r.reason, /passphrase-protected/);
    assert.match(r.reason, /ssh-keygen -p/);
    assert.ok(!r.reason.includes("secret-pass"));
  }
});

Deno.test("ssh_key: refuses PKCS#8, public keys, PuTTY, garbage, truncation", () => {
  const cases: [string, RegExp][] = [
    [keys.rsaPkcs8.key, /PKCS#8/],
    [keys.ed25519.pub, /public key/],
    ["PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\n", /puttygen/],
    ["", /empty/],
    ["hello world", /not a PEM\/OpenSSH private key/],
    [keys.ed25519.key.replaceAll("\n", "\\n"), /literal \\n/],
    ["-----BEGIN OPENSSH PRIVATE KEY-----\n%%%%\n-----END OPENSSH PRIVATE KEY-----", /not valid base64/],
    ["-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----", /bad header|truncated/],
    ["-----BEGIN RSA PRIVATE KEY-----\nMIIEow==\n-----END RSA PRIVATE KEY-----", /cannot be parsed/],
    ["-----BEGIN FOO PRIVATE KEY-----\nAAAA\n-----END FOO PRIVATE KEY-----", /unsupported key block/],
  ];
  // Cut the body of a real key in half: a typical copy/paste accident.
  const lines = keys.ed25519.key.trim().split("\n");
  const half = [lines[0], ...lines.slice(1, -1).slice(0, 2), lines.at(-1)!].join("\n");
  cases.push([half, /truncated or corrupt/]);
  for (const [text, want] of cases) {
    const r = checkPrivateKey(text);
    assert.ok(!r.ok, `accepted: ${text.slice(0, 40)}`);
    assert.match(r.reason, want);
  }
});
