import assert from "node:assert/strict";
import { LIB_SH } from "./script_text.ts";
import {
  factsKey,
  factsWire,
  type HostFacts,
  kvmAccess,
  likelyFacts,
  parseFacts,
  UNKNOWN_FACTS,
} from "./host_facts.ts";

Deno.test("host facts: the wire form round-trips, and what is not one is refused", () => {
  const cases: [HostFacts, string][] = [
    [{ podman: "5.4.2", kvm: { mode: 0o660, gid: 993 } }, "podman=5.4.2 kvm=660:993"],
    [{ podman: "5.3.0-rc1", kvm: { mode: 0o666, gid: 0 } }, "podman=5.3.0-rc1 kvm=666:0"],
    [{ podman: "4.9.3", kvm: null }, "podman=4.9.3 kvm=none"],
    [{ podman: "", kvm: { mode: 0, gid: 0 } }, "podman= kvm=0:0"],
  ];
  for (const [facts, wire] of cases) {
    assert.equal(factsWire(facts), wire);
    assert.deepEqual(parseFacts(wire), facts);
  }
  assert.equal(factsWire(undefined), UNKNOWN_FACTS);
  for (
    const bad of [
      UNKNOWN_FACTS,
      "",
      "podman=5.4.2",
      "podman=5.4.2 kvm=",
      "podman=5.4.2 kvm=8:1",
      "podman=$(id) kvm=none",
    ]
  ) {
    assert.equal(parseFacts(bad), undefined, bad);
  }
});

Deno.test("host facts: how the non-root exporter can open /dev/kvm, by mode", () => {
  const kvm = (mode: number, gid = 993) => kvmAccess({ mode, gid });
  assert.deepEqual(kvmAccess(null), { kind: "missing" });
  assert.deepEqual(kvm(0o666), { kind: "world" }, "Fedora/RHEL");
  assert.deepEqual(kvm(0o660), { kind: "group", gid: 993 }, "Debian/Ubuntu");
  assert.deepEqual(kvm(0o670), { kind: "group", gid: 993 });
  assert.deepEqual(kvm(0o600, 0), { kind: "denied", mode: 0o600, gid: 0 });
  assert.deepEqual(kvm(0o640), { kind: "denied", mode: 0o640, gid: 993 }, "read alone is not enough");
  assert.deepEqual(kvm(0o604), { kind: "denied", mode: 0o604, gid: 993 });
  assert.equal(factsKey({ host: "lab1", port: 2222 }), "lab1:2222");
});

/** lib.sh's host_facts under `shell`, with /dev/kvm's place taken by `node` (a path made in a temp dir, or none). */
async function probe(shell: string, podman: string, node?: { mode: number }): Promise<string> {
  const dir = await Deno.makeTempDir();
  try {
    let sh = LIB_SH;
    if (node) {
      // a regular file stands in for the device node: `-c` is rewritten to `-f` for it, the rest runs as on a host
      await Deno.writeTextFile(`${dir}/kvm`, "");
      await Deno.chmod(`${dir}/kvm`, node.mode);
      sh = sh.replaceAll("-c /dev/kvm", `-f ${dir}/kvm`).replaceAll("/dev/kvm", `${dir}/kvm`);
    } else sh = sh.replaceAll("/dev/kvm", `${dir}/none`);
    const script = `podman() { echo ${podman}; }\n${sh}\nhost_facts\nprintf '%s\\n' "$facts"\n`;
    const out = await new Deno.Command(shell, { args: ["-c", script] }).output();
    assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
    return new TextDecoder().decode(out.stdout).trim();
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("host facts: lib.sh's host_facts prints the wire form under dash and bash", async () => {
  const gid = Deno.gid() ?? 0;
  for (const shell of ["dash", "bash"]) {
    assert.equal(await probe(shell, "'podman version 5.4.2'"), "podman=5.4.2 kvm=none", shell);
    const wire = await probe(shell, "'podman version 4.9.3'", { mode: 0o660 });
    assert.equal(wire, `podman=4.9.3 kvm=660:${gid}`, shell);
    assert.deepEqual(parseFacts(wire), { podman: "4.9.3", kvm: { mode: 0o660, gid } });
  }
});

Deno.test("host facts: podman's version is asked once per binary, again once it is replaced or rewritten in place", async () => {
  for (const shell of ["dash", "bash"]) {
    const dir = await Deno.makeTempDir();
    try {
      // a FAKE podman, an executable first in the scripts' PATH, that counts the times it is run
      const fake = (v: string) =>
        Deno.writeTextFile(`${dir}/podman`, `#!/bin/sh\necho x >>${dir}/calls\necho 'podman version ${v}'\n`, {
          mode: 0o755,
        });
      const sh = LIB_SH.replace("PATH=/usr/local/sbin:", `PATH=${dir}:/usr/local/sbin:`);
      assert.notEqual(sh, LIB_SH, "lib.sh sets its PATH as this test expects");
      const facts = async () => {
        const script = `RUN_DIR=${dir}/run\n${sh}\nhost_facts\nprintf '%s\\n' "$podman_version"\n`;
        const out = await new Deno.Command(shell, { args: ["-c", script] }).output();
        assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
        const calls = (await Deno.readTextFile(`${dir}/calls`).catch(() => "")).split("\n").length - 1;
        return [new TextDecoder().decode(out.stdout).trim(), calls];
      };
      await fake("5.4.2");
      assert.deepEqual(await facts(), ["5.4.2", 1], shell);
      assert.deepEqual(await facts(), ["5.4.2", 1], `${shell}: kept, not asked again`);
      // the same size, the same inode, within the same second: what a wrapper rewritten by a test (or a hand) looks like
      await Deno.writeTextFile(`${dir}/podman`, (await Deno.readTextFile(`${dir}/podman`)).replace("5.4.2", "5.4.3"));
      assert.deepEqual(await facts(), ["5.4.3", 2], `${shell}: rewritten in place`);
      await Deno.remove(`${dir}/podman`);
      await fake("4.9.3");
      assert.deepEqual(await facts(), ["4.9.3", 3], `${shell}: replaced`);
      assert.deepEqual(await facts(), ["4.9.3", 3], shell);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  }
});

Deno.test("host facts: a first contact's guess is the facts most hosts met have, the first met of a tie", () => {
  const debian = { podman: "5.4.2", kvm: { mode: 0o660, gid: 993 } };
  const fedora = { podman: "5.6.1", kvm: { mode: 0o666, gid: 36 } };
  assert.equal(likelyFacts([]), undefined);
  assert.deepEqual(likelyFacts([fedora, debian, { ...debian }]), debian);
  assert.deepEqual(likelyFacts([fedora, debian]), fedora);
  assert.deepEqual(likelyFacts(new Map([["a:22", debian], ["b:22", fedora], ["c:22", fedora]]).values()), fedora);
});
