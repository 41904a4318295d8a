import { privateLabNet } from "../../test/env.ts";
import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import { createHash } from "node:crypto";
import { hostKeyAlgorithms, hostKeyError, SshError, SshPool, type SshTarget } from "./ssh.ts";
import { fingerprint, knownHostsLine } from "./known_hosts.ts";
import { type LabHost, type LabNet, startLabHosts, stopLabHosts } from "../../test/labhost/labhost.ts";

// ---------------------------------------------------------------------------------------------------- helpers

async function keygen(dir: string, name: string, type: string): Promise<string> {
  const r = await new Deno.Command("ssh-keygen", {
    args: ["-q", "-t", type, "-N", "", "-C", name, "-f", `${dir}/${name}`],
    stdout: "null",
  }).output();
  assert.ok(r.success, `ssh-keygen -t ${type}`);
  return await Deno.readTextFile(`${dir}/${name}`);
}

/** A well-formed ed25519 public key blob that belongs to no host. */
function foreignEd25519Blob(seed: string): Buffer {
  const t = Buffer.from("ssh-ed25519");
  const k = createHash("sha256").update(seed).digest();
  const len = (n: number) => {
    const b = Buffer.alloc(4);
    b.writeUInt32BE(n);
    return b;
  };
  return Buffer.concat([len(t.length), t, len(k.length), k]);
}

async function rejection(p: Promise<unknown>): Promise<SshError> {
  try {
    await p;
  } catch (e) {
    assert.ok(e instanceof SshError, `expected SshError, got ${e}`);
    return e;
  }
  assert.fail("expected a rejection");
}

const tmp = await Deno.makeTempDir({ prefix: "ssh_test" });
const clientKey = await keygen(tmp, "client", "ed25519");
globalThis.addEventListener("unload", () => Deno.removeSync(tmp, { recursive: true }));

function localTarget(port: number, extra: Partial<SshTarget> = {}): SshTarget {
  return {
    host: "127.0.0.1",
    port,
    user: "root",
    privateKey: clientKey,
    knownHosts: "",
    hostKeyPolicy: "Strict",
    ...extra,
  };
}

/** A port nothing listens on: bind, note the port, close. */
function closedPort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (l.addr as Deno.NetAddr).port;
  l.close();
  return port;
}

function shq(s: string): string {
  return `'${s.replaceAll("'", `'"'"'`)}'`;
}

// ---------------------------------------------------------------------------------------------------- no network

Deno.test("ssh: host key algorithms put the known key types first", () => {
  assert.deepEqual(hostKeyAlgorithms([]).slice(0, 3), ["ssh-ed25519", "rsa-sha2-512", "rsa-sha2-256"]);
  const rsaFirst = hostKeyAlgorithms(["ssh-rsa"]);
  assert.deepEqual(rsaFirst.slice(0, 3), ["rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"]);
  assert.ok(rsaFirst.indexOf("ssh-ed25519") > 2);
  assert.equal(new Set(rsaFirst).size, rsaFirst.length, "no duplicates");
  assert.equal(hostKeyAlgorithms(["ecdsa-sha2-nistp256", "ssh-ed25519"])[0], "ecdsa-sha2-nistp256");
  assert.ok(!hostKeyAlgorithms(["sk-ssh-ed25519@openssh.com"]).includes("sk-ssh-ed25519@openssh.com" as never));
});

Deno.test("ssh: host key refusal messages carry host:port, fingerprints and the fix", () => {
  const t = { host: "lab1", port: 2222 };
  const strict = hostKeyError(t, { status: "unknown", fingerprint: "SHA256:new" });
  assert.equal(strict.kind, "hostkey");
  assert.match(strict.message, /lab1:2222/);
  assert.match(strict.message, /SHA256:new/);
  assert.match(strict.message, /ssh-keyscan -p 2222 lab1/);
  const mismatch = hostKeyError(t, { status: "mismatch", fingerprint: "SHA256:new", expected: ["ssh-rsa SHA256:old"] });
  assert.match(mismatch.message, /expected ssh-rsa SHA256:old, host presented SHA256:new/);
  assert.match(mismatch.message, /update known_hosts in the Secret/);
  assert.match(hostKeyError(t, { status: "revoked", fingerprint: "SHA256:x" }).message, /@revoked/);
});

Deno.test("ssh: unusable private keys fail with kind key before any connection", async () => {
  const pool = new SshPool();
  try {
    const ecdsa = await keygen(tmp, "ecdsa", "ecdsa");
    const e1 = await rejection(pool.exec(localTarget(closedPort(), { privateKey: ecdsa }), "true"));
    assert.equal(e1.kind, "key");
    assert.match(e1.message, /ECDSA keys are not supported under Deno's ssh2/);
    const e2 = await rejection(pool.exec(localTarget(closedPort(), { privateKey: "not a key" }), "true"));
    assert.equal(e2.kind, "key");
    assert.equal(pool.stats().connectionsOpened, 0);
  } finally {
    await pool.close();
  }
});

Deno.test("ssh: refused connect backs off and fails fast with the next allowed time", async () => {
  const pool = new SshPool({ backoffBaseMs: 400, backoffMaxMs: 400 });
  try {
    const target = localTarget(closedPort());
    const first = await rejection(pool.exec(target, "true"));
    assert.equal(first.kind, "connect");
    assert.match(first.message, /127\.0\.0\.1:\d+.*ECONNREFUSED/);
    const t0 = performance.now();
    const second = await rejection(pool.exec(target, "true"));
    assert.ok(performance.now() - t0 < 50, "during backoff no new attempt is made");
    assert.equal(second.kind, "connect");
    assert.match(second.message, /next attempt allowed in \d+s/);
    assert.ok(second.retryAt !== undefined && second.retryAt > Date.now());
    await new Promise((r) => setTimeout(r, second.retryAt! - Date.now() + 10));
    const third = await rejection(pool.exec(target, "true"));
    assert.ok(!third.message.includes("next attempt"), "after the backoff a real attempt is made");
  } finally {
    await pool.close();
  }
});

Deno.test("ssh: concurrent callers share one connect attempt; handshake timeout is kind connect", async () => {
  // A server that accepts TCP and never speaks SSH: the handshake can only time out.
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const accepted: Deno.Conn[] = [];
  const acceptLoop = (async () => {
    for await (const c of listener) accepted.push(c);
  })();
  const pool = new SshPool({ connectTimeoutMs: 300 });
  try {
    const target = localTarget((listener.addr as Deno.NetAddr).port);
    const errors = await Promise.all([1, 2, 3, 4, 5].map(() => rejection(pool.exec(target, "true"))));
    assert.equal(accepted.length, 1, "five callers, one TCP connection");
    for (const e of errors) {
      assert.equal(e.kind, "connect");
      assert.match(e.message, /no SSH handshake within 300ms/);
    }
  } finally {
    await pool.close();
    listener.close();
    await acceptLoop.catch(() => {});
    for (const c of accepted) c.close();
  }
});

Deno.test("ssh: handshakes beyond maxHandshakes wait their turn, and connect only when it comes (M14)", async () => {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const accepted: Deno.Conn[] = [];
  const acceptLoop = (async () => {
    for await (const c of listener) accepted.push(c);
  })();
  const hungUp = new Set<number>();
  const hangUp = (i: number) => {
    if (!hungUp.has(i)) accepted[i].close();
    hungUp.add(i);
  };
  const pool = new SshPool({ connectTimeoutMs: 30_000, maxHandshakes: 1 });
  // Observed through the pool's own count of waiting callers, not through timeouts: a holder and its waiters with
  // one connect timeout each would race for who ends first.
  const until = async (what: string, ok: () => boolean) => {
    for (let i = 0; !ok(); i++) {
      if (i > 3000) {
        throw new Error(`timed out waiting for ${what}: ${accepted.length} accepted, ${JSON.stringify(pool.stats())}`);
      }
      await new Promise((r) => setTimeout(r, 10));
    }
  };
  try {
    const port = (listener.addr as Deno.NetAddr).port;
    // three pool keys (users), one host that never speaks SSH
    const errors = ["a", "b", "c"].map((user) => rejection(pool.exec(localTarget(port, { user }), "true")));
    await until(
      "one handshake in progress, two waiting",
      () => accepted.length === 1 && pool.stats().handshakesWaiting === 2,
    );
    // the host hangs up on the first: the next caller gets its turn, and only then opens a socket
    hangUp(0);
    await until("the second's turn", () => accepted.length === 2 && pool.stats().handshakesWaiting === 1);
    assert.equal((await errors[0]).kind, "connect");
    hangUp(1);
    await until("the third's turn", () => accepted.length === 3 && pool.stats().handshakesWaiting === 0);
    assert.equal((await errors[1]).kind, "connect");
    await pool.close();
    assert.equal((await errors[2]).kind, "closed");
  } finally {
    await pool.close();
    listener.close();
    await acceptLoop.catch(() => {});
    accepted.forEach((_, i) => hangUp(i));
  }
});

Deno.test("ssh: close() during a connect attempt returns promptly and fails the caller as closed", async () => {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const accepted: Deno.Conn[] = [];
  const acceptLoop = (async () => {
    for await (const c of listener) accepted.push(c);
  })();
  const pool = new SshPool({ connectTimeoutMs: 30_000 });
  try {
    const pending = rejection(pool.exec(localTarget((listener.addr as Deno.NetAddr).port), "true"));
    await new Promise((r) => setTimeout(r, 100));
    const t0 = performance.now();
    await pool.close();
    assert.ok(performance.now() - t0 < 500, "close() does not wait for the 30s handshake timeout");
    assert.equal((await pending).kind, "closed");
  } finally {
    listener.close();
    await acceptLoop.catch(() => {});
    for (const c of accepted) c.close();
  }
});

Deno.test("ssh: exec after close fails with kind closed", async () => {
  const pool = new SshPool();
  await pool.close();
  const e = await rejection(pool.exec(localTarget(22), "true"));
  assert.equal(e.kind, "closed");
});

Deno.test("ssh: invalid targets are refused before connecting", async () => {
  const pool = new SshPool();
  try {
    for (const bad of [{ host: "" }, { port: 0 }, { port: 70000 }, { user: "" }]) {
      const e = await rejection(pool.exec(localTarget(22, bad), "true"));
      assert.match(e.message, /invalid SSH target/);
    }
  } finally {
    await pool.close();
  }
});

// ---------------------------------------------------------------------------------------------------- lab host

const net: LabNet = await privateLabNet(2);
const isRoot = Deno.uid?.() === 0;

/** Another set using the same /24 would steal the route to our host; say so instead of timing out obscurely. */
async function subnetTakenBy(): Promise<string | undefined> {
  const out = await new Deno.Command("ip", { args: ["-4", "-o", "route", "show", `${net.subnet}.0/24`] }).output();
  const devs = new TextDecoder().decode(out.stdout).split("\n").map((l) => / dev (\S+)/.exec(l)?.[1]).filter(Boolean);
  return devs.find((d) => d !== net.bridge);
}

Deno.test({
  name: "ssh: against a real lab host (OpenSSH, systemd)",
  ignore: !isRoot,
  async fn(t) {
    const other = await subnetTakenBy();
    if (other) throw new Error(`${net.subnet}.0/24 is already routed via ${other}; remove that set before testing`);
    let host: LabHost;
    try {
      const t0 = performance.now();
      [host] = await startLabHosts(net, 1);
      console.log(`  lab host up in ${((performance.now() - t0) / 1000).toFixed(1)}s`);
    } catch (e) {
      await stopLabHosts(net).catch(() => {});
      throw e;
    }
    const pools: SshPool[] = [];
    const newPool = (opts?: ConstructorParameters<typeof SshPool>[0]) => {
      const p = new SshPool(opts);
      pools.push(p);
      return p;
    };
    try {
      const knownHosts = await Deno.readTextFile(host.knownHostsPath);
      const privateKey = await Deno.readTextFile(host.privateKeyPath);
      const target: SshTarget = {
        host: host.address,
        port: host.port,
        user: host.user,
        privateKey,
        knownHosts,
        hostKeyPolicy: "Strict",
      };
      const hostEd25519 = knownHosts.split("\n").find((l) => l.startsWith(`${host.address} ssh-ed25519 `))!;
      assert.ok(hostEd25519, "harness known_hosts has the host's ed25519 key");
      const hostFp = fingerprint(hostEd25519.split(" ")[2]);
      const pool = newPool();

      await t.step("exec returns exit code, stdout, stderr; stdin reaches sh -s", async () => {
        let t0 = performance.now();
        const r = await pool.exec(target, "echo out; echo err >&2; exit 7");
        const connectMs = performance.now() - t0;
        assert.deepEqual(r, { code: 7, stdout: "out\n", stderr: "err\n" });
        const rtts: number[] = [];
        for (let i = 0; i < 20; i++) {
          t0 = performance.now();
          await pool.exec(target, "true");
          rtts.push(performance.now() - t0);
        }
        rtts.sort((a, b) => a - b);
        console.log(
          `  first exec incl. connect ${connectMs.toFixed(0)}ms; pooled exec round trip median ` +
            `${rtts[10].toFixed(1)}ms, max ${rtts[19].toFixed(1)}ms`,
        );
        const s = await pool.exec(target, "sh -s", { stdin: "set -eu\necho from-script\ncat /etc/hostname\n" });
        assert.deepEqual(s, { code: 0, stdout: `from-script\n${host.name}\n`, stderr: "" });
        // Secrets travel inside the script (here-document), never in the command line.
        const withSecret = await pool.exec(target, "sh -s", { stdin: "cat <<'EOF'\nS3CRET-VALUE\nEOF\n" });
        assert.equal(withSecret.stdout, "S3CRET-VALUE\n");
        const u = await pool.exec(target, "printf 'ünïcødé ✓'");
        assert.equal(u.stdout, "ünïcødé ✓");
        const big = await pool.exec(target, "head -c 3000000 /dev/zero | tr '\\0' x");
        assert.equal(big.stdout.length, 3_000_000);
        const killed = await pool.exec(target, "kill -TERM $$");
        assert.equal(killed.signal, "SIGTERM");
        assert.equal(killed.code, 143);
        assert.equal(pool.stats().connectionsOpened, 1);
      });

      await t.step("Strict works with the host's key in known_hosts, plain or hashed", async () => {
        const p = newPool();
        assert.equal((await p.exec({ ...target, knownHosts: hostEd25519 + "\n" }, "echo ok")).stdout, "ok\n");
        const file = `${tmp}/kh_hashed`;
        await Deno.writeTextFile(file, hostEd25519 + "\n");
        const h = await new Deno.Command("ssh-keygen", { args: ["-H", "-f", file], stdout: "null", stderr: "null" })
          .output();
        assert.ok(h.success);
        const hashed = await Deno.readTextFile(file);
        assert.ok(hashed.startsWith("|1|"));
        const p2 = newPool();
        assert.equal((await p2.exec({ ...target, knownHosts: hashed }, "echo ok")).stdout, "ok\n");
        await p.close();
        await p2.close();
      });

      await t.step("address: connect to an address, check the host key under the host's name", async () => {
        const named = hostEd25519.replace(host.address, "lab-h1.example");
        const p = newPool();
        const aliased = { ...target, host: "lab-h1.example", address: host.address, knownHosts: named };
        assert.equal((await p.exec(aliased, "echo via-address")).stdout, "via-address\n");
        // The address's own known_hosts line does not vouch for the name.
        const e = await rejection(p.exec({ ...aliased, host: "other.example" }, "true"));
        assert.equal(e.kind, "hostkey");
        assert.match(e.message, /other\.example:22/);
        await p.close();
      });

      await t.step("known RSA key only: the host is asked for its RSA key, not ed25519", async () => {
        const scan = await new Deno.Command("ssh-keyscan", {
          args: ["-T", "5", "-t", "rsa", "-p", String(host.port), host.address],
          stdout: "piped",
          stderr: "null",
        }).output();
        const rsaLine = new TextDecoder().decode(scan.stdout).split("\n").find((l) => l.includes(" ssh-rsa "));
        assert.ok(rsaLine, "ssh-keyscan found an RSA host key");
        const p = newPool();
        const r = await p.exec({ ...target, knownHosts: rsaLine + "\n" }, "echo rsa-ok");
        assert.equal(r.stdout, "rsa-ok\n");
        await p.close();
      });

      await t.step("Strict without an entry refuses, naming host and presented fingerprint", async () => {
        const p = newPool();
        const e = await rejection(p.exec({ ...target, knownHosts: "# nothing here\n" }, "true"));
        assert.equal(e.kind, "hostkey");
        assert.equal(e.host, host.address);
        assert.ok(e.message.includes(`${host.address}:${host.port}`), e.message);
        assert.ok(e.message.includes(hostFp), e.message);
        assert.ok(e.message.includes(`ssh-keyscan -p ${host.port} ${host.address}`), e.message);
        assert.equal(p.stats().connectionsOpened, 0);
        // Same known_hosts again: within the backoff, fail fast with the same diagnosis.
        const again = await rejection(p.exec({ ...target, knownHosts: "# nothing here\n" }, "true"));
        assert.equal(again.kind, "hostkey");
        assert.match(again.message, /next attempt allowed/);
        // Fixed known_hosts: no need to sit out the backoff.
        assert.equal((await p.exec(target, "echo fixed")).stdout, "fixed\n");
        await p.close();
      });

      await t.step("a wrong key in known_hosts refuses, showing expected and presented fingerprints", async () => {
        const wrong = knownHostsLine(host.address, host.port, foreignEd25519Blob("impostor"));
        const p = newPool();
        const e = await rejection(p.exec({ ...target, knownHosts: wrong }, "true"));
        assert.equal(e.kind, "hostkey");
        assert.ok(e.message.includes(fingerprint(foreignEd25519Blob("impostor"))), e.message);
        assert.ok(e.message.includes(hostFp), e.message);
        assert.match(e.message, /MISMATCH/);
        // AcceptNew does not override a mismatch: only hosts with no entry at all are trusted on first use.
        const e2 = await rejection(p.exec({ ...target, knownHosts: wrong, hostKeyPolicy: "AcceptNew" }, "true"));
        assert.equal(e2.kind, "hostkey");
        await p.close();
      });

      await t.step("a @revoked host key is refused even when also listed", async () => {
        const p = newPool();
        const revoked = `${hostEd25519}\n@revoked * ${hostEd25519.split(" ").slice(1).join(" ")}\n`;
        const e = await rejection(p.exec({ ...target, knownHosts: revoked }, "true"));
        assert.equal(e.kind, "hostkey");
        assert.match(e.message, /@revoked/);
        await p.close();
      });

      await t.step("AcceptNew trusts a new host once and reports a line that then works under Strict", async () => {
        const accepted: { line: string; fp: string }[] = [];
        const p = newPool({ onHostKeyAccepted: (_t, line, fp) => void accepted.push({ line, fp }) });
        const r = await p.exec({ ...target, knownHosts: "", hostKeyPolicy: "AcceptNew" }, "echo first");
        assert.equal(r.stdout, "first\n");
        assert.equal(accepted.length, 1);
        assert.equal(accepted[0].fp, hostFp);
        assert.ok(accepted[0].line.startsWith(`${host.address} ssh-ed25519 `), accepted[0].line);
        // Pinned: a fresh pool with only that line under Strict connects.
        const strict = newPool();
        const s = await strict.exec(
          { ...target, knownHosts: accepted[0].line, hostKeyPolicy: "Strict" },
          "echo pinned",
        );
        assert.equal(s.stdout, "pinned\n");
        // Once pinned, a different key for the host is refused even under AcceptNew.
        const other = knownHostsLine(host.address, host.port, foreignEd25519Blob("other"));
        const e = await rejection(p.exec({ ...target, knownHosts: other, hostKeyPolicy: "AcceptNew" }, "true"));
        assert.equal(e.kind, "hostkey");
        await p.close();
        await strict.close();
      });

      await t.step(
        "a pooled connection reused with another caller's known_hosts pins for that caller too (M9)",
        async () => {
          // Two namespaces, one key: the pool key is the same, but each namespace has its own pin Secret.
          const pinned: { ns: string; fp: string }[] = [];
          let fail = false;
          const p = newPool({
            onHostKeyAccepted: (t, _line, fp) => {
              if (fail) throw new Error("API server unavailable");
              pinned.push({ ns: t.pinScope!, fp });
            },
          });
          const tofu = (ns: string) => ({
            ...target,
            knownHosts: "",
            hostKeyPolicy: "AcceptNew" as const,
            pinScope: ns,
          });
          assert.equal((await p.exec(tofu("a"), "echo a")).stdout, "a\n");
          const b = await Promise.all([1, 2, 3].map(() => p.exec(tofu("b"), "echo b")));
          assert.deepEqual(b.map((r) => r.stdout), ["b\n", "b\n", "b\n"]);
          assert.deepEqual(pinned, [{ ns: "a", fp: hostFp }, { ns: "b", fp: hostFp }], "b pinned once, on reuse");
          assert.equal(p.stats().connectionsOpened, 1, "the connection was reused");
          // A pin that cannot be recorded runs nothing for that caller, and is tried again next time.
          fail = true;
          const other = { ...tofu("c"), knownHosts: "# c's own\n" };
          const e = await rejection(p.exec(other, "echo never"));
          assert.equal(e.kind, "hostkey");
          assert.match(e.message, /not trusted because recording it failed: API server unavailable/);
          fail = false;
          assert.equal((await p.exec(other, "echo c")).stdout, "c\n");
          // The same known_hosts text in another namespace is still that namespace's first use.
          assert.equal((await p.exec(tofu("d"), "echo d")).stdout, "d\n");
          assert.deepEqual(pinned.map((x) => x.ns), ["a", "b", "c", "d"]);
          await p.close();
        },
      );

      await t.step("AcceptNew does not trust the host when recording the key fails", async () => {
        const p = newPool({
          onHostKeyAccepted: () => {
            throw new Error("API server unavailable");
          },
        });
        const e = await rejection(p.exec({ ...target, knownHosts: "", hostKeyPolicy: "AcceptNew" }, "true"));
        assert.equal(e.kind, "hostkey");
        assert.match(e.message, /API server unavailable/);
        await p.close();
      });

      await t.step("AcceptNew: a host key refusal from the recorder is reported as it is", async () => {
        const pinned = fingerprint(foreignEd25519Blob("pinned meanwhile"));
        const p = newPool({
          onHostKeyAccepted: (t, _line, fp) => {
            throw hostKeyError(t, { status: "mismatch", fingerprint: fp, expected: [`ssh-ed25519 ${pinned}`] });
          },
        });
        const e = await rejection(p.exec({ ...target, knownHosts: "", hostKeyPolicy: "AcceptNew" }, "true"));
        assert.equal(e.kind, "hostkey");
        assert.match(e.message, /^ssh [^:]+:\d+: HOST KEY MISMATCH/);
        assert.ok(e.message.includes(pinned) && e.message.includes(hostFp), e.message);
        await p.close();
      });

      await t.step("20 concurrent execs share one connection with at most maxChannels channels", async () => {
        const p = newPool({ maxChannels: 6 });
        await p.exec(target, "rm -rf /tmp/qsp-conc && mkdir /tmp/qsp-conc");
        // Each command registers itself, samples how many are running, and lingers so they overlap.
        const cmd = "touch /tmp/qsp-conc/$$; n=$(ls /tmp/qsp-conc | wc -l); sleep 0.3; rm /tmp/qsp-conc/$$; echo $n";
        const t0 = performance.now();
        const results = await Promise.all(Array.from({ length: 20 }, () => p.exec(target, cmd)));
        const ms = performance.now() - t0;
        const peaks = results.map((r) => Number(r.stdout.trim()));
        assert.ok(results.every((r) => r.code === 0));
        assert.ok(Math.max(...peaks) <= 6, `at most 6 at once, saw ${Math.max(...peaks)}`);
        assert.ok(Math.max(...peaks) >= 2, "they did run in parallel");
        assert.equal(p.stats().connectionsOpened, 1);
        assert.equal(p.stats().open, 1);
        console.log(`  20 x 0.3s commands over 6 channels: ${ms.toFixed(0)}ms, peak ${Math.max(...peaks)} concurrent`);
        await p.close();

        // Many tiny commands with as many channels as sshd allows: closes and opens race inside sshd, and the
        // refused opens must be retried, never surfaced.
        const busy = newPool({ maxChannels: 10 });
        const t1 = performance.now();
        const many = await Promise.all(Array.from({ length: 300 }, (_, i) => busy.exec(target, `echo ${i}`)));
        assert.deepEqual(many.map((r) => r.stdout), Array.from({ length: 300 }, (_, i) => `${i}\n`));
        const st = busy.stats();
        assert.equal(st.connectionsOpened, 1);
        console.log(
          `  300 tiny commands over 10 channels: ${(performance.now() - t1).toFixed(0)}ms, ` +
            `${st.channelRetries} refused opens retried`,
        );
        await busy.close();
      });

      await t.step("a timed-out command is killed and the connection serves the next one", async () => {
        const t0 = performance.now();
        const e = await rejection(pool.exec(target, "sleep 30", { timeoutMs: 500, stdin: "TOPSECRET\n" }));
        assert.equal(e.kind, "timeout");
        assert.ok(performance.now() - t0 < 2000);
        assert.ok(!e.message.includes("TOPSECRET"), "stdin never appears in errors");
        const opened = pool.stats().connectionsOpened;
        const next = await pool.exec(target, "pgrep -f 'sleep 3[0]' || echo none");
        assert.equal(next.stdout, "none\n", "the timed-out process was killed on the host");
        assert.equal(pool.stats().connectionsOpened, opened, "same connection");
      });

      await t.step("the wait for a channel is inside the command's limit, and the fence ends it (M1)", async () => {
        const p = newPool({ maxChannels: 1 });
        await p.exec(target, "true");
        const stopHog = new AbortController();
        // callers take the slot in the order they came: the hog holds the only one from here on
        const hog = rejection(p.exec(target, "sleep 60", { signal: stopHog.signal }));
        const waited = await rejection(p.exec(target, "echo late", { timeoutMs: 300 }));
        assert.equal(waited.kind, "timeout");
        assert.match(waited.message, /no free channel within 300ms: all 1 are busy.*not run/);
        const fence = new AbortController();
        const parked = rejection(p.exec(target, "echo fenced", { signal: fence.signal }));
        fence.abort(new Error("leadership lost"));
        const fenced = await parked;
        assert.equal(fenced.kind, "closed");
        assert.match(fenced.message, /leadership lost/);
        stopHog.abort(new Error("done"));
        assert.equal((await hog).kind, "closed");
        assert.equal((await p.exec(target, "echo free")).stdout, "free\n", "the slot comes back once the hog is gone");
        await p.close();
      });

      await t.step(
        "output beyond maxOutputBytes kills the command with kind output; the connection stays (M5)",
        async () => {
          const p = newPool({ maxOutputBytes: 1024 * 1024 });
          const e = await rejection(p.exec(target, "head -c 3000000 /dev/zero | tr '\\0' x; sleep 30"));
          assert.equal(e.kind, "output");
          assert.match(e.message, /more than 1048576 bytes on stdout and was killed \(maxOutputBytes\)/);
          const flood = await rejection(p.exec(target, "head -c 2000000 /dev/zero >&2"));
          assert.match(flood.message, /on stderr/);
          assert.equal((await p.exec(target, "echo free")).stdout, "free\n");
          assert.equal(p.stats().connectionsOpened, 1, "same connection");
          await p.close();
        },
      );

      await t.step("idle connections are closed; at maxConnections the longest idle one makes room (M14)", async () => {
        const idle = newPool({ idleCloseMs: 300 });
        await idle.exec(target, "true");
        await new Promise((r) => setTimeout(r, 400)); // longer than idleCloseMs: that is what is tested
        await idle.exec(target, "true");
        assert.equal(idle.stats().connectionsOpened, 2, "the idle connection was closed, a new one opened");
        assert.equal(idle.stats().open, 1);
        await idle.close();

        const p = newPool({ maxConnections: 1 });
        const viaAddress = { ...target, address: host.address }; // another pool key to the same host
        await p.exec(target, "true");
        await p.exec(viaAddress, "true");
        assert.deepEqual([p.stats().open, p.stats().connectionsOpened], [1, 2], "the idle one made room");
        const stop = new AbortController();
        const busy = rejection(p.exec(viaAddress, "sleep 60", { signal: stop.signal }));
        await p.exec(viaAddress, "true"); // queued behind it: once this ran, the sleep holds its channel
        const e = await rejection(p.exec(target, "true"));
        assert.equal(e.kind, "connect");
        assert.match(e.message, /1 SSH connections are open and busy.*--max-ssh-connections/);
        stop.abort(new Error("done"));
        await busy;
        await p.close();
      });

      await t.step("after sshd restarts and drops sessions, the pool reconnects", async () => {
        const p = newPool({ backoffBaseMs: 200, backoffMaxMs: 1000 });
        await p.exec(target, "true");
        // Debian's ssh.service uses KillMode=process: a plain restart keeps existing sessions (and our connection).
        assert.equal((await p.exec(target, "systemctl restart ssh && echo restarted")).stdout, "restarted\n");
        assert.equal((await p.exec(target, "echo still")).stdout, "still\n");
        // Now also drop every session, as a crash or a reboot of sshd would; a command running then fails as closed.
        const running = rejection(p.exec(target, "sleep 20"));
        await new Promise((r) => setTimeout(r, 200));
        await p.exec(
          target,
          "systemd-run --quiet sh -c 'sleep 0.3; systemctl restart ssh; pkill -x sshd-session'",
        );
        const lost = await running;
        assert.equal(lost.kind, "closed");
        const droppedAt = performance.now();
        const deadline = Date.now() + 20_000;
        let r;
        for (;;) {
          try {
            r = await p.exec(target, "echo back");
            break;
          } catch (e) {
            if (!(e instanceof SshError) || Date.now() > deadline) throw e;
            await new Promise((res) => setTimeout(res, Math.max(50, (e.retryAt ?? Date.now()) - Date.now())));
          }
        }
        assert.equal(r.stdout, "back\n");
        assert.equal(p.stats().connectionsOpened, 2);
        console.log(`  reconnected ${(performance.now() - droppedAt).toFixed(0)}ms after the connection dropped`);
        await p.close();
      });

      // Makes the host drop all SSH traffic after 0.3s for `seconds`, then accept it again, without our help
      // (we cannot reach it meanwhile). The connection goes silent rather than closed, as on a pulled cable.
      const blackhole = async (p: SshPool, seconds: number) => {
        const script = "sleep 0.3; nft add table inet qsp_blackhole; " +
          "nft add chain inet qsp_blackhole in '{ type filter hook input priority 0; }'; " +
          `nft add rule inet qsp_blackhole in tcp dport 22 drop; sleep ${seconds}; nft delete table inet qsp_blackhole`;
        // A transient service outlives our session; systemd-run timers would fire up to a minute late (AccuracySec).
        const r = await p.exec(target, `systemd-run --quiet sh -c ${shq(script)}`);
        assert.equal(r.code, 0, r.stderr);
      };
      const untilOk = async (p: SshPool, deadlineMs: number) => {
        const deadline = Date.now() + deadlineMs;
        for (;;) {
          try {
            return await p.exec(target, "echo ok");
          } catch (e) {
            if (!(e instanceof SshError) || Date.now() > deadline) throw e;
            await new Promise((res) => setTimeout(res, Math.max(50, (e.retryAt ?? Date.now()) - Date.now())));
          }
        }
      };

      await t.step("keepalive notices a silent connection; the pool reconnects once the host answers", async () => {
        const p = newPool({ keepaliveIntervalMs: 300, keepaliveCountMax: 2, connectTimeoutMs: 1000 });
        await p.exec(target, "true");
        await blackhole(p, 3);
        const running = rejection(p.exec(target, "sleep 20"));
        const t0 = performance.now();
        const lost = await running;
        assert.equal(lost.kind, "closed");
        console.log(`  silent connection declared dead after ${(performance.now() - t0).toFixed(0)}ms`);
        assert.equal(p.stats().open, 0);
        assert.equal((await untilOk(p, 20_000)).stdout, "ok\n");
        assert.equal(p.stats().connectionsOpened, 2);
        await p.close();
      });

      await t.step("without keepalive, a timed-out command on a silent connection drops it", async () => {
        const p = newPool({ keepaliveIntervalMs: 0, connectTimeoutMs: 1000 });
        await p.exec(target, "true");
        await blackhole(p, 8);
        await new Promise((r) => setTimeout(r, 500));
        const e = await rejection(p.exec(target, "echo unreachable", { timeoutMs: 500 }));
        assert.equal(e.kind, "timeout");
        assert.equal(p.stats().open, 1, "not yet known to be dead");
        await new Promise((r) => setTimeout(r, 5_500));
        assert.equal(p.stats().open, 0, "dropped after the close grace period");
        assert.equal((await untilOk(p, 20_000)).stdout, "ok\n");
        await p.close();
      });

      await t.step(
        "a refused key is not tried again soon: sshd's per-source penalty never shuts the address out",
        async () => {
          const p = newPool();
          const stranger = { ...target, privateKey: await keygen(tmp, "stranger-penalty", "ed25519") };
          // A caller asking every 250 ms for 6 s, as reconciles of several Exporters on this host would: with the
          // connect backoff's 1 s start, 3 or 4 attempts reached sshd (authfail:5s each; shut out past min:15s).
          let attempts = 0;
          for (let i = 0; i < 24; i++) {
            const e = await rejection(p.exec(stranger, "true"));
            assert.equal(e.kind, "auth");
            if (!e.message.includes("next attempt")) attempts++;
            else assert.ok(e.retryAt! - Date.now() > 4_000, "the next attempt is at least 10 s after the first");
            await new Promise((r) => setTimeout(r, 250));
          }
          assert.equal(attempts, 1, "one attempt reached sshd");
          // the address is still let in: the right key connects (a fresh pool, so a new connection)
          assert.equal((await newPool().exec(target, "echo in")).stdout, "in\n");
        },
      );

      await t.step("wrong user or wrong key gives kind auth", async () => {
        const p = newPool();
        const e1 = await rejection(p.exec({ ...target, user: "nosuchuser" }, "true"));
        assert.equal(e1.kind, "auth");
        assert.match(e1.message, /nosuchuser@/);
        const otherKey = await keygen(tmp, "stranger", "ed25519");
        const e2 = await rejection(p.exec({ ...target, privateKey: otherKey }, "true"));
        assert.equal(e2.kind, "auth");
        assert.match(e2.message, /authorized_keys/);
        await p.close();
      });

      await t.step("close() ends connections, fails running commands, and later execs fail as closed", async () => {
        const running = rejection(pool.exec(target, "sleep 10"));
        await new Promise((r) => setTimeout(r, 200));
        await pool.close();
        assert.equal((await running).kind, "closed");
        assert.equal(pool.stats().open, 0);
        assert.equal((await rejection(pool.exec(target, "true"))).kind, "closed");
      });
    } finally {
      for (const p of pools) await p.close();
      await stopLabHosts(net);
    }
  },
});
