/**
 * scripts/stage.sh as the host runs it (remote.ts STAGE_SCRIPT_TEXT, `/bin/sh SCRIPT PULL IMAGE VOLUME CONTAINER`),
 * under dash and bash, with a FAKE podman first on PATH (testdata/fake_podman: a state directory standing in for the
 * registry, the image store, containers and volumes) and the launcher cache in a temporary directory.
 */
import { STAGE_SH } from "./script_text.ts";
import assert from "node:assert/strict";
import { STAGE_SCRIPT_TEXT } from "./remote.ts";
import { runShell, SHELLS, withValues } from "./script_harness.ts";

const FAKE_PODMAN = new URL("./testdata/fake_podman", import.meta.url).pathname;
const IMAGE = "quay.io/jumpstarter-dev/jumpstarter:latest";
const A = "a".repeat(64), B = "b".repeat(64);

interface Host {
  dir: string;
  /** stage.sh with its cache in the temporary directory, run under `shell` with the fake podman on PATH. */
  stage(shell: string, pull: string): Promise<{ code: number; stderr: string; calls: string[] }>;
  /** The image ID, with its launcher, is in the store; `where` names it for the reference (registry, host or both). */
  image(id: string, where: ("registry" | "images")[]): Promise<void>;
  volumeExec(): Promise<{ text: string; mode: number } | undefined>;
}

async function host(): Promise<Host> {
  const dir = await Deno.makeTempDir();
  for (const d of ["bin", "registry", "images", "store", "containers", "volumes/v-shared", "launchers"]) {
    await Deno.mkdir(`${dir}/${d}`, { recursive: true });
  }
  await Deno.symlink(FAKE_PODMAN, `${dir}/bin/podman`);
  const script = withValues(STAGE_SCRIPT_TEXT, STAGE_SH, { LAUNCHERS: `${dir}/launchers` });
  const key = IMAGE.replaceAll("/", "_");
  return {
    dir,
    async stage(shell, pull) {
      await Deno.writeTextFile(`${dir}/calls`, "");
      const out = await runShell(shell, script, ["-s", pull, IMAGE, "v-shared", "x-stage"], {
        PATH: `${dir}/bin:${Deno.env.get("PATH")}`,
        FAKE_PODMAN: dir,
      });
      const calls = (await Deno.readTextFile(`${dir}/calls`)).split("\n").filter((l) => l);
      return { code: out.code, stderr: out.stderr, calls };
    },
    async image(id, where) {
      await Deno.mkdir(`${dir}/store/${id}/jumpstarter/bin`, { recursive: true });
      await Deno.writeTextFile(`${dir}/store/${id}/jumpstarter/bin/jumpstarter-exec`, `launcher of ${id.slice(0, 4)}`);
      for (const w of where) await Deno.writeTextFile(`${dir}/${w}/${key}`, `${id}\n`);
    },
    async volumeExec() {
      const f = `${dir}/volumes/v-shared/jumpstarter-exec`;
      try {
        return { text: await Deno.readTextFile(f), mode: (await Deno.stat(f)).mode! & 0o777 };
      } catch (e) {
        if (e instanceof Deno.errors.NotFound) return undefined;
        throw e;
      }
    },
  };
}

const copiedOut = (calls: string[]) => calls.filter((c) => /^(create|cp|rm) /.test(c));
const entries = (d: string) => [...Deno.readDirSync(d)].map((e) => e.name).sort();

Deno.test("stage.sh, under dash and bash: the launcher is copied out of an image once per image id, onto the volume at every start", async () => {
  for (const shell of SHELLS) {
    const h = await host();
    try {
      await h.image(A, ["images"]);
      const first = await h.stage(shell, "missing");
      assert.equal(first.code, 0, `${shell}: ${first.stderr}`);
      assert.deepEqual(copiedOut(first.calls), [
        `create --replace --name x-stage --pull never --network none --entrypoint /jumpstarter/bin/jumpstarter-exec ${A}`,
        "cp x-stage:/jumpstarter/bin/jumpstarter-exec " +
        first.calls.find((c) => c.startsWith("cp "))!.split(" ")[2],
        "rm -f -v x-stage",
      ], shell);
      assert.ok(!first.calls.some((c) => c.startsWith("pull ")), `${shell}: missing pulls only what is missing`);
      assert.equal(await Deno.readTextFile(`${h.dir}/launchers/${A}/jumpstarter-exec`), "launcher of aaaa");
      assert.deepEqual(await h.volumeExec(), { text: "launcher of aaaa", mode: 0o755 }, shell);
      assert.deepEqual(entries(`${h.dir}/containers`), [], `${shell}: the temporary container is removed`);

      // the next start: from the cache, no container; the volume's copy is the image's again whatever became of it
      await Deno.writeTextFile(`${h.dir}/volumes/v-shared/jumpstarter-exec`, "scribbled over");
      const again = await h.stage(shell, "missing");
      assert.equal(again.code, 0, `${shell}: ${again.stderr}`);
      assert.deepEqual(copiedOut(again.calls), [], shell);
      assert.deepEqual(
        again.calls.map((c) => c.split(" ").slice(0, 2).join(" ")),
        ["image inspect", "volume inspect"],
        `${shell}: a start from the cache asks podman twice: the image's id, the volume's mount point`,
      );
      assert.deepEqual(await h.volumeExec(), { text: "launcher of aaaa", mode: 0o755 }, shell);
      assert.deepEqual(entries(`${h.dir}/volumes/v-shared`), ["jumpstarter-exec"], `${shell}: no temp file left`);
      assert.deepEqual(entries(`${h.dir}/launchers/${A}`), ["jumpstarter-exec"], `${shell}: no temp file left`);

      // the tag moved on in the registry: Always pulls it, and the new id is staged anew
      await h.image(B, ["registry"]);
      const moved = await h.stage(shell, "always");
      assert.equal(moved.code, 0, `${shell}: ${moved.stderr}`);
      assert.ok(moved.calls.includes(`pull -q ${IMAGE}`), shell);
      assert.equal(copiedOut(moved.calls).length, 3, shell);
      assert.deepEqual(await h.volumeExec(), { text: "launcher of bbbb", mode: 0o755 }, shell);
      assert.deepEqual(entries(`${h.dir}/launchers`), [A, B], shell);
    } finally {
      await Deno.remove(h.dir, { recursive: true });
    }
  }
});

Deno.test("stage.sh, under dash and bash: Never fails with its reason when the image is not on the host; newer falls back on the local image", async () => {
  for (const shell of SHELLS) {
    const h = await host();
    try {
      const never = await h.stage(shell, "never");
      assert.notEqual(never.code, 0, shell);
      assert.match(
        never.stderr,
        /^stage: the exporter image quay\.io\/jumpstarter-dev\/jumpstarter:latest is not on this host and its imagePullPolicy is Never/,
        shell,
      );
      assert.ok(!never.calls.some((c) => c.startsWith("pull ")), `${shell}: Never never pulls`);
      assert.equal(await h.volumeExec(), undefined, shell);

      const unreachable = await h.stage(shell, "newer");
      assert.notEqual(unreachable.code, 0, `${shell}: no registry and no local image`);
      assert.match(unreachable.stderr, /connection refused/, shell);

      await h.image(A, ["images"]);
      const local = await h.stage(shell, "newer");
      assert.equal(local.code, 0, `${shell}: ${local.stderr}`);
      assert.match(local.stderr, /not pulled, the local image is used: .*connection refused/, shell);
      assert.deepEqual(await h.volumeExec(), { text: "launcher of aaaa", mode: 0o755 }, shell);

      const bad = await h.stage(shell, "sometimes");
      assert.equal(bad.code, 2, shell);
      assert.match(bad.stderr, /unknown pull policy sometimes/, shell);
    } finally {
      await Deno.remove(h.dir, { recursive: true });
    }
  }
});
