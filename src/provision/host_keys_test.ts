/** Pinning host keys on first use: one key per host:port, whatever the cache said, written with a precondition. */
import assert from "node:assert/strict";
import type { KubeObject, Secret } from "../api/types.ts";
import { FakeKube } from "../kube/fake_client.ts";
import type { Resource } from "../kube/client.ts";
import { SECRETS } from "../kube/resources.ts";
import { fingerprint, knownHostsLine } from "../host/known_hosts.ts";
import { SshError } from "../host/ssh.ts";
import { decodeSecretValue, type LabTarget, PINNED_HOST_KEYS_KEY, PINNED_HOST_KEYS_SECRET } from "./credentials.ts";
import { pinHostKey } from "./host_keys.ts";

const NS = "lab";
const TARGET: LabTarget = {
  namespace: NS,
  host: "lab-host-01.example.com",
  port: 22,
  user: "root",
  privateKey: "",
  knownHosts: "",
  hostKeyPolicy: "AcceptNew",
};

/** The wire blob (base64) of a fresh ed25519 host key. */
async function hostKey(): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "host_keys_test" });
  const r = await new Deno.Command("ssh-keygen", {
    args: ["-q", "-t", "ed25519", "-N", "", "-f", `${dir}/key`],
    stdout: "null",
  }).output();
  assert.ok(r.success, "ssh-keygen");
  const blob = (await Deno.readTextFile(`${dir}/key.pub`)).split(" ")[1];
  await Deno.remove(dir, { recursive: true });
  return blob;
}
const [KEY_A, KEY_B] = [await hostKey(), await hostKey()];
const line = (blob: string, port = 22) => knownHostsLine(TARGET.host, port, blob);

const pins = async (kube: FakeKube) =>
  decodeSecretValue(await kube.find<Secret>(SECRETS, NS, PINNED_HOST_KEYS_SECRET), PINNED_HOST_KEYS_KEY);

async function refusal(p: Promise<unknown>): Promise<SshError> {
  const e = await p.then(() => undefined, (e) => e);
  assert.ok(e instanceof SshError, `expected a refusal, got ${e}`);
  return e;
}

Deno.test("host keys: the first key of a host:port is pinned once; another port has its own pin", async () => {
  const kube = new FakeKube();
  await pinHostKey(kube, TARGET, line(KEY_A));
  await pinHostKey(kube, TARGET, line(KEY_A));
  await pinHostKey(kube, { ...TARGET, port: 2222 }, line(KEY_B, 2222));
  assert.equal(await pins(kube), `${line(KEY_A)}\n${line(KEY_B, 2222)}\n`);
  assert.equal(kube.writes.length, 2, "the same key again writes nothing");
});

Deno.test("host keys: a second key for a pinned host:port is refused with both fingerprints", async () => {
  const kube = new FakeKube();
  await pinHostKey(kube, TARGET, line(KEY_A));
  // the caller's known_hosts (from a cache that has not seen the pin yet) says nothing about the host
  const e = await refusal(pinHostKey(kube, TARGET, line(KEY_B)));
  assert.equal(e.kind, "hostkey");
  assert.ok(e.message.includes(fingerprint(KEY_A)), e.message);
  assert.ok(e.message.includes(fingerprint(KEY_B)), e.message);
  assert.ok(e.message.includes(`Secret ${NS}/${PINNED_HOST_KEYS_SECRET}`), e.message);
  assert.equal(await pins(kube), `${line(KEY_A)}\n`, "the pin is unchanged");
});

/** An API server where another replica pins `line` between our read and our write. */
class RacingKube extends FakeKube {
  constructor(private theirs: string) {
    super();
  }

  override create<T extends KubeObject>(r: Resource, obj: T): Promise<T> {
    this.race();
    return super.create(r, obj);
  }

  override mergePatch<T>(r: Resource, ns: string | undefined, name: string, patch: unknown, sub?: string) {
    this.race();
    return super.mergePatch<T>(r, ns, name, patch, sub);
  }

  private race(): void {
    if (!this.theirs) return;
    const data = { [PINNED_HOST_KEYS_KEY]: btoa(`${this.theirs}\n`) };
    this.put<Secret>(SECRETS, { metadata: { name: PINNED_HOST_KEYS_SECRET, namespace: NS }, data });
    this.theirs = "";
  }
}

Deno.test("host keys: a pin written between our read and our write is not overwritten, and then refuses ours", async () => {
  for (const existing of [false, true]) {
    const kube = new RacingKube(line(KEY_A));
    if (existing) {
      kube.put<Secret>(SECRETS, { metadata: { name: PINNED_HOST_KEYS_SECRET, namespace: NS }, data: {} });
    }
    const e = await refusal(pinHostKey(kube, TARGET, line(KEY_B)));
    assert.ok(e.message.includes(fingerprint(KEY_A)), e.message);
    assert.equal(await pins(kube), `${line(KEY_A)}\n`, existing ? "patch with resourceVersion" : "create");
  }
});
