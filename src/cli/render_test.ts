import assert from "node:assert/strict";
import { parse } from "yaml";
import { resolveParams } from "../provision/params.ts";
import { renderInstance } from "../host/render.ts";
import { type Manifest, PLACEHOLDER_UID, renderCommand, renderManifests } from "./render.ts";

const example = (file: string) => new URL(`../../manifests/examples/${file}`, import.meta.url).pathname;
const CLASS = example("virtualtargetclass.yaml");
const SET = example("exporterset.yaml");
const seed = async (): Promise<Manifest[]> =>
  await Promise.all([CLASS, SET].map(async (path) => ({ path, text: await Deno.readTextFile(path) })));

async function render(args: string[], stdin?: string) {
  const out: string[] = [];
  const err: string[] = [];
  const io = {
    out: (t: string) => out.push(t),
    err: (t: string) => err.push(t),
    stdin: () => stdin === undefined ? Promise.reject(new Error("no stdin in this test")) : Promise.resolve(stdin),
  };
  const code = await renderCommand(args, io);
  return { code, out: out.join("\n"), err: err.join("\n") };
}

/** The `==> PATH (...) <==` blocks of the output, by path. */
function files(text: string): Map<string, { header: string; content: string }> {
  const blocks = new Map<string, { header: string; content: string }>();
  for (const part of text.split(/\n\n(?===> )/).slice(1)) {
    const [header, ...content] = part.split("\n");
    blocks.set(/^==> (\S+) /.exec(header)![1], { header, content: content.join("\n") });
  }
  return blocks;
}

Deno.test("render: the seed's class and set print the three files with their paths, the host and units", async () => {
  const r = await render(["--class", CLASS, "--set", SET, "--endpoint", "grpc.jumpstarter.example.com:443"]);
  assert.equal(r.code, 0, r.err);
  assert.equal(r.err, "");
  const name = "aarch64-ssh-pool-xxxxx";
  assert.match(r.out, /^# ExporterSet jumpstarter\/aarch64-ssh-pool \(VirtualTargetClass qemu-ssh-aarch64\)/);
  assert.match(r.out, /\n# host: +root@lab-host-01\.example\.com:22\n/);
  assert.match(r.out, new RegExp(`\n# volume: +jumpstarter-${name}-shared\n`));
  assert.match(r.out, new RegExp(`\n# units: +${name}-runtime\\.service ${name}-exporter\\.service\n`));

  const blocks = files(r.out);
  assert.deepEqual([...blocks.keys()], [
    `/etc/jumpstarter/exporters/${name}.d/${name}.yaml`,
    `/etc/containers/systemd/${name}-runtime.container`,
    `/etc/containers/systemd/${name}-exporter.container`,
  ]);
  const [config, runtime] = blocks.values();
  assert.match(config.header, new RegExp(`mode 0600, linked as /etc/jumpstarter/exporters/${name}\\.yaml\\)`));
  assert.match(runtime.header, /\(mode 0644\) <==$/);

  // exactly what run would write for a new Exporter of the set, with what only the cluster knows as placeholders
  const [cls, set] = (await seed()).map((m) => parse(m.text));
  const resolved = resolveParams(cls, set);
  assert.ok(resolved.ok);
  const expected = renderInstance({
    namespace: "jumpstarter",
    name,
    uid: PLACEHOLDER_UID,
    setName: "aarch64-ssh-pool",
    params: resolved.params,
    drivers: [{ name: "qemu", type: "jumpstarter_driver_qemu.driver.Qemu" }],
    exitOnLeaseEnd: true,
    endpoint: "grpc.jumpstarter.example.com:443",
    token: "<redacted>",
    caBundle: "",
  });
  assert.deepEqual([...blocks.values()].map((b) => `${b.content}\n`), expected.files.map((f) => f.content));
  assert.equal(parse(config.content).token, "<redacted>");
});

Deno.test("render -f: one multi-document file renders the same; --exporter names the instance", async () => {
  const [cls, set] = await seed();
  const both = renderManifests([{ path: "all.yaml", text: `${cls.text}---\n${set.text}` }]);
  const apart = renderManifests(await seed());
  assert.ok(both.ok && apart.ok);
  assert.equal(both.text, apart.text);

  const named = renderManifests(await seed(), { exporter: "board-7" });
  assert.ok(named.ok);
  assert.match(named.text, /\n==> \/etc\/containers\/systemd\/board-7-runtime\.container /);
  assert.match(named.text, /\nendpoint: <endpoint>\n/, "the endpoint is a placeholder unless given");
});

Deno.test("render: the token is only ever shown redacted", async () => {
  const r = renderManifests(await seed());
  assert.ok(r.ok);
  const tokens = r.text.split("\n").filter((l) => /token/i.test(l));
  assert.deepEqual(tokens.filter((l) => !l.startsWith("#")), ["token: <redacted>"]);
});

Deno.test("render: parameter errors are printed one per line with object, field and fix, exit 1", async () => {
  const [cls, set] = await seed();
  const dir = await Deno.makeTempDir();
  try {
    const path = `${dir}/all.yaml`;
    const badClass = cls.text.replace("    host:\n      name: lab-host-01.example.com\n", "");
    const badSet = set.text.replace(
      "  minReplicas: 0\n",
      '  minReplicas: 0\n  parameters:\n    resources:\n      cpu: "4"\n',
    );
    assert.notEqual(badClass, cls.text);
    assert.notEqual(badSet, set.text);
    await Deno.writeTextFile(path, `${badClass}---\n${badSet}`);
    const r = await render(["-f", path]);
    assert.equal(r.code, 1);
    assert.equal(r.out, "", "nothing is rendered");
    assert.deepEqual(r.err.split("\n"), [
      "VirtualTargetClass qemu-ssh-aarch64: spec.parameters.host.name: missing: set parameters.host.name (the lab " +
      "host's DNS name or IP address) or parameters.hosts (a pool of them) on the VirtualTargetClass " +
      "qemu-ssh-aarch64 or on the ExporterSet aarch64-ssh-pool",
      'ExporterSet aarch64-ssh-pool: spec.parameters.resources.cpu: expected an integer, got the string "4": write 4 ' +
      "without quotes",
    ]);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("render: manifests that cannot be rendered say why", async () => {
  const [cls, set] = await seed();
  const errors = (manifests: Manifest[], opts = {}) => {
    const r = renderManifests(manifests, opts);
    assert.ok(!r.ok);
    return r.errors;
  };
  assert.deepEqual(errors([set]), [
    "ExporterSet aarch64-ssh-pool: spec.virtualTargetClassName: no VirtualTargetClass jumpstarter/qemu-ssh-aarch64 " +
    "in the files (they have none): add its manifest",
  ]);
  assert.deepEqual(errors([cls]), [`no ExporterSet in ${CLASS}: give the set's manifest too`]);
  const other = {
    path: "c.yaml",
    text: cls.text.replace("provisioner: qemu-ssh.jumpstarter.dev", "provisioner: qemu.jumpstarter.dev"),
  };
  assert.match(
    errors([other, set])[0],
    /^VirtualTargetClass qemu-ssh-aarch64: spec\.provisioner: "qemu\.jumpstarter\.dev"/,
  );
  assert.match(errors([{ path: "bad.yaml", text: "kind: [unclosed" }])[0], /^bad\.yaml: document 1: /);
  assert.match(
    errors([cls, set], { exporter: "Not_A_Name" })[0],
    /^ExporterSet aarch64-ssh-pool: refusing to render: exporter name "Not_A_Name"/,
  );
  const second = { path: "s2.yaml", text: set.text.replace("name: aarch64-ssh-pool", "name: second-pool") };
  assert.match(
    errors([cls, set, second], { exporter: "x" })[0],
    /^--exporter names one Exporter, but .* 2 ExporterSets/,
  );
});

Deno.test("render: usage errors exit 2 with the usage and no stack trace; --help exits 0", async () => {
  for (
    const args of [[], ["--bogus"], ["--class"], ["-f", SET, "extra"], ["-f", SET, "-o", "xml"], ["-f", "-", "-f", "-"]]
  ) {
    const r = await render(args);
    assert.equal(r.code, 2, `${args}`);
    assert.match(r.err, /^error: .*\n\nusage: qemu-ssh-provisioner render /);
    assert.doesNotMatch(r.err, /\n +at /);
  }
  const help = await render(["--help"]);
  assert.equal(help.code, 0);
  assert.match(help.out, /^usage: qemu-ssh-provisioner render --class CLASS\.yaml --set SET\.yaml/);
  const missing = await render(["-f", "/nonexistent/set.yaml"]);
  assert.equal(missing.code, 1);
  assert.match(missing.err, /^\/nonexistent\/set\.yaml: cannot read: /);
});

Deno.test("render -f -: the manifests from stdin, alone or with files, render as from files", async () => {
  const [cls, set] = await seed();
  const files = await render(["-f", CLASS, "-f", SET]);
  assert.equal(files.code, 0, files.err);
  const piped = await render(["-f", "-"], `${cls.text}---\n${set.text}`);
  assert.equal(piped.code, 0, piped.err);
  assert.equal(piped.out, files.out);
  const mixed = await render(["--class", CLASS, "--set", "-"], set.text);
  assert.equal(mixed.code, 0, mixed.err);
  assert.equal(mixed.out, files.out);
  const bad = await render(["-f", "-"], "kind: [unclosed");
  assert.equal(bad.code, 1);
  assert.match(bad.err, /^<stdin>: document 1: /);
  const unreadable = await render(["-f", "-"]);
  assert.equal(unreadable.code, 1);
  assert.match(unreadable.err, /^<stdin>: cannot read: no stdin in this test/);
});

Deno.test("render -o yaml|json: the same files as data; text stays the default", async () => {
  const text = await render(["-f", CLASS, "-f", SET]);
  assert.equal((await render(["-f", CLASS, "-f", SET, "-o", "text"])).out, text.out);
  const json = await render(["-f", CLASS, "-f", SET, "--output", "json"]);
  assert.equal(json.code, 0, json.err);
  const yaml = await render(["-f", CLASS, "-f", SET, "-o", "yaml"]);
  assert.equal(yaml.code, 0, yaml.err);
  const data = JSON.parse(json.out);
  assert.deepEqual(parse(yaml.out), data, "yaml and json say the same");
  assert.equal(data.length, 1);
  const [one] = data;
  const name = "aarch64-ssh-pool-xxxxx";
  assert.deepEqual(
    { ...one, files: undefined },
    {
      exporterSet: "jumpstarter/aarch64-ssh-pool",
      virtualTargetClass: "qemu-ssh-aarch64",
      exporter: name,
      host: "root@lab-host-01.example.com:22",
      volume: `jumpstarter-${name}-shared`,
      units: { runtime: `${name}-runtime.service`, exporter: `${name}-exporter.service` },
      files: undefined,
    },
  );
  const blocks = files(text.out);
  assert.deepEqual(
    one.files.map((f: { path: string; mode: string; owner: number; links: string[] }) => [f.path, f.mode, f.owner]),
    [
      [`/etc/jumpstarter/exporters/${name}.d/${name}.yaml`, "0600", 65532],
      [`/etc/containers/systemd/${name}-runtime.container`, "0644", 0],
      [`/etc/containers/systemd/${name}-exporter.container`, "0644", 0],
    ],
  );
  assert.deepEqual(one.files[0].links, [`/etc/jumpstarter/exporters/${name}.yaml`]);
  for (const f of one.files) assert.equal(`${blocks.get(f.path)!.content}\n`, f.content, f.path);
  assert.equal(parse(one.files[0].content).token, "<redacted>");
  assert.match(yaml.out, /^ +content: \|/m, "file contents are block scalars, readable as they are");
});

Deno.test("render: the seed's :latest images are pulled when newer (no policy stated); a stated one is kept", async () => {
  const [cls, set] = await seed();
  const seeded = renderManifests([cls, set]);
  assert.ok(seeded.ok);
  assert.equal(seeded.text.match(/^Pull=newer$/gm)?.length, 2);
  assert.match(seeded.text, /^ExecStartPre=\/bin\/sh \S+\/stage-launcher\.sh newer /m);
  const stated = {
    path: "set.yaml",
    text: `${set.text}  images:\n    exporter:\n      imagePullPolicy: IfNotPresent\n`,
  };
  const r = renderManifests([cls, stated]);
  assert.ok(r.ok, JSON.stringify(r));
  const quadlets = files(r.text);
  const name = "aarch64-ssh-pool-xxxxx";
  assert.match(quadlets.get(`/etc/containers/systemd/${name}-exporter.container`)!.content, /^Pull=missing$/m);
  const runtime = quadlets.get(`/etc/containers/systemd/${name}-runtime.container`)!.content;
  assert.match(runtime, /^Pull=newer$/m, "the runtime image states nothing");
  assert.match(
    runtime,
    /^ExecStartPre=\/bin\/sh \S+\/stage-launcher\.sh missing /m,
    "staging follows the exporter's policy",
  );
});

Deno.test("render --host-facts: the files for a host with those facts; bad facts are a usage error", async () => {
  const exporterQuadlet = (out: string) => [...files(out)].find(([p]) => p.endsWith("-exporter.container"))![1].content;
  const debian = await render(["--class", CLASS, "--set", SET, "--host-facts", "podman=5.4.2 kvm=660:993"]);
  assert.equal(debian.code, 0, debian.err);
  assert.match(exporterQuadlet(debian.out), /^PodmanArgs=--group-add 993$/m, "the seed's class asks for KVM");
  const unknown = await render(["--class", CLASS, "--set", SET]);
  assert.doesNotMatch(exporterQuadlet(unknown.out), /group-add/, "no facts: as for a host not reached yet");
  const bad = await render(["--class", CLASS, "--set", SET, "--host-facts", "kvm=yes"]);
  assert.equal(bad.code, 2);
  assert.match(bad.err, /--host-facts must look like "podman=5\.4\.2 kvm=660:993"/);
});
