/**
 * The real quadlet generators of the Podman releases where a key we render appeared or is last missing (4.4.1, 4.6.2,
 * 4.9.3, 5.2.5, 5.3.2, 5.4.2; built from the Go module proxy by test/podman/build.sh) convert the files rendered for their
 * version, with the exporter in its runtime's network namespace and ordered after it. And each older generator
 * rejects or misreads what is rendered for the next newer dialect, so a threshold in host/quadlet_dialect.ts set too
 * low fails here. Runs on this machine: `quadlet -dryrun` only reads files.
 */
import assert from "node:assert/strict";
import { builtPath } from "./built.ts";
import { renderInstance } from "../src/host/render.ts";
import { seedInstance, seedParams } from "./fixtures.ts";

const BUILD = `${import.meta.dirname}/podman/build.sh`;
const inst = seedInstance({ params: { ...seedParams, runtime: { kvm: true, devices: [] } } });
const name = inst.name;

async function generator(version: string): Promise<string> {
  // 4.9.3's comes with the lab hosts' full build; the others alone, pure Go, seconds each
  const dir = version === "4.9.3" ? await builtPath(BUILD, version) : await builtPath(BUILD, version, "quadlet-only");
  return `${dir}/quadlet`;
}

/** `quadlet -dryrun` over the quadlets rendered for `renderedFor`: the services it makes, and what it said. */
async function convert(
  quadlet: string,
  renderedFor: string,
): Promise<{ services: Record<string, string>; log: string }> {
  const dir = await Deno.makeTempDir({ prefix: "qsp-quadlet-" });
  try {
    const r = renderInstance(inst, { podman: renderedFor, kvm: { mode: 0o660, gid: 993 } });
    for (const f of r.files.filter((f) => f.path.endsWith(".container"))) {
      await Deno.writeTextFile(`${dir}/${f.path.split("/").pop()}`, f.content);
    }
    const out = await new Deno.Command(quadlet, { args: ["-dryrun"], env: { QUADLET_UNIT_DIRS: dir } }).output();
    const dec = new TextDecoder();
    const services: Record<string, string> = {};
    for (
      const part of dec.decode(out.stdout).split(/^---(.+)\.service---$/m).slice(1).reduce<string[][]>(
        (acc, x, i) => (i % 2 ? acc[acc.length - 1].push(x) : acc.push([x]), acc),
        [],
      )
    ) services[part[0]] = part[1];
    return { services, log: dec.decode(out.stderr) };
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

const rendered = (podman: string) =>
  JSON.stringify(renderInstance(inst, { podman, kvm: { mode: 0o660, gid: 993 } }).files);
const execStart = (unit: string) => /^ExecStart=(.*)$/m.exec(unit)?.[1] ?? "";

Deno.test("quadlet of each Podman release converts what is rendered for it; the next dialect breaks it", async () => {
  const versions = ["4.4.1", "4.6.2", "4.9.3", "5.2.5", "5.3.2", "5.4.2"];
  const boundaries: string[] = [];
  for (const [i, version] of versions.entries()) {
    const quadlet = await generator(version);
    const { services, log } = await convert(quadlet, version);
    assert.deepEqual(Object.keys(services).sort(), [`${name}-exporter`, `${name}-runtime`], `${version}: ${log}`);
    const ex = services[`${name}-exporter`];
    assert.match(execStart(ex), new RegExp(` --network[= ]container:${name}-runtime `), version);
    for (const k of ["Requires", "After", "BindsTo"]) {
      assert.match(ex, new RegExp(`^${k}=${name}-runtime\\.service$`, "m"), `${version}: ${k}`);
    }
    assert.match(execStart(ex), / --group-add 993 /, `${version}: the kvm group`);
    assert.match(execStart(ex), / --pull[= ]newer /, `${version}: the pull policy`);
    assert.match(execStart(ex), / --device[= ]\/dev\/kvm /, `${version}: /dev/kvm, the optional mark taken off`);
    // The next release whose rendering differs (a dialect boundary): this generator cannot use that, it refuses a key
    // (the unit is not made) or reads the runtime's unit name as a network name.
    const next = versions.slice(i + 1).find((v) => rendered(v) !== rendered(version));
    if (!next) continue;
    const newer = await convert(quadlet, next);
    const exNewer = newer.services[`${name}-exporter`];
    assert.ok(
      Object.keys(newer.services).length < 2 || / --network[= ][^ ]*\.container /.test(execStart(exNewer)),
      `${version} converts what is rendered for ${next} as well: is the threshold too high?\n${newer.log}`,
    );
    boundaries.push(
      `${version} cannot use ${next}'s: ${
        /unsupported key '[A-Za-z]+'|cannot get the resource name.*/.exec(newer.log)?.[0] ??
          /--network[= ][^ ]*/.exec(execStart(exNewer))?.[0]
      }`,
    );
  }
  assert.equal(boundaries.length, versions.length - 1, "every generator but the newest is shown the next form");
  console.log(`  ${boundaries.join("\n  ")}`);
});
