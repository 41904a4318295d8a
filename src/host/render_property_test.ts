/**
 * Bad input, property-based, on the way to a lab host: accepted parameters with hostile driver configs, names,
 * endpoints, tokens and CA bundles, rendered into the ExporterConfig and the quadlets and wrapped into the apply
 * script. The unit files must stay lines systemd reads as we mean them, the YAML must read back as the object we
 * meant (also as YAML 1.1, which is how the exporter's PyYAML reads it), and the script must parse and carry every
 * value quoted or base64-encoded.
 */
import { APPLY_SH, LIB_SH } from "./script_text.ts";
import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import { createHash } from "node:crypto";
import fc from "fast-check";
import { parse, parseDocument, Scalar, visit } from "yaml";
import type { DriverSpec } from "../api/types.ts";
import { type InstanceParams, QEMU_DRIVER_TYPE, qemuQuantity } from "./instance_params.ts";
import { resolveParams } from "../provision/params.ts";
import {
  hostileString,
  type NamedProperty,
  obj,
  registerProperties,
  TCP_DRIVER_TYPE,
  validDrivers,
  validPair,
} from "../provision/params_property_test.ts";
import {
  CONFIG_DIR,
  type Instance,
  LAUNCHER_SOCKET,
  MANAGED_HEADER,
  OWNER_PREFIX,
  QUADLET_DIR,
  quadletPath,
  type RenderedInstance,
  renderInstance,
  SSH_FORWARD_PORT,
  STAGE_SCRIPT,
} from "./render.ts";
import { type ApplyOptions, applyScript, removeScript } from "./remote.ts";
import { definitions, recorder, records, runShell } from "./script_harness.ts";

// ---------------------------------------------------------------- generators

/** Valid names another YAML type claims: a namespace called "no" is a boolean to a YAML 1.1 reader. */
const typedLabel = fc.constantFrom(
  "no",
  "on",
  "yes",
  "off",
  "null",
  "true",
  "2024-01-01",
  "0b101",
  "1e3",
  "0x1f",
  "nan",
);
const k8sLabel = fc.oneof(
  { weight: 6, arbitrary: fc.stringMatching(/^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/) },
  { weight: 1, arbitrary: typedLabel },
);
/** A DNS-1123 subdomain as Kubernetes checks object names, up to its 253 characters (render allows 200). */
const k8sSubdomain = fc.array(k8sLabel, { minLength: 1, maxLength: 5 }).map((l) => l.join("."))
  .filter((s) => s.length <= 253);
const longSubdomain = fc.integer({ min: 190, max: 253 }).map((n) =>
  `${"a".repeat(62)}.`.repeat(4).slice(0, n - 1) + "z"
);

const validIdentity = fc.record({
  namespace: k8sLabel,
  name: fc.oneof({ withCrossShrink: true }, { weight: 6, arbitrary: k8sSubdomain }, {
    weight: 1,
    arbitrary: longSubdomain,
  }),
  setName: k8sSubdomain,
  uid: fc.uuid(),
});
/** Identity fields as the API server admits them; now and then one is hostile (render is the last line of defence). */
const identity = fc.oneof(
  { weight: 9, arbitrary: validIdentity },
  {
    weight: 1,
    arbitrary: fc.tuple(validIdentity, fc.constantFrom("namespace", "name", "setName", "uid"), hostileString)
      .map(([id, k, v]) => ({ ...id, [k]: v })),
  },
);
type Identity = { namespace: string; name: string; setName: string; uid: string };

const secrets = fc.record({
  endpoint: hostileString,
  token: hostileString,
  caBundle: fc.oneof(hostileString, fc.constant("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")),
  exitOnLeaseEnd: fc.boolean(),
});

/** Accepted parameters (resolveParams said ok) with the set's drivers, and anything in the other Instance fields. */
const accepted: fc.Arbitrary<{ params: InstanceParams; drivers: DriverSpec[] }> = validPair.map((p) => {
  const r = resolveParams(p.cls, p.set);
  if (!r.ok) throw new Error(`validPair not accepted: ${JSON.stringify(r.errors)}`);
  return { params: r.params, drivers: p.set.spec.template?.spec?.drivers ?? [] };
});

export const renderCase: fc.Arbitrary<Instance> = fc.tuple(accepted, identity, secrets).map(([a, id, s]) => ({
  ...id,
  ...s,
  params: a.params,
  drivers: a.drivers,
}));

/** Kubernetes admits it, and the exporter name fits render's documented 200 characters. */
const isAdmissible = (id: Identity) =>
  /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/.test(id.namespace) && id.namespace.length <= 63 &&
  [id.name, id.setName].every((n) =>
    n.length <= 253 && n.split(".").every((l) => /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/.test(l))
  ) && id.name.length <= 200 && /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/.test(id.uid);

/** What may become a file, unit, container or volume name and a unit file value without quoting. */
const isSafeName = (s: string) => /^[A-Za-z0-9][A-Za-z0-9.-]*$/.test(s) && !s.includes("..") && s.length <= 253;
/** A uid is only ever a label value or a quoted argument, never a name on its own. */
const isSafeUid = (s: string) => /^[A-Za-z0-9-]{1,64}$/.test(s);

export function tryRender(inst: Instance): RenderedInstance | undefined {
  try {
    return renderInstance(inst);
  } catch (e) {
    // the one documented refusal: an identity field that cannot be a name on the host
    assert.match(String((e as Error).message), /^refusing to render: (exporter name|namespace|ExporterSet name|uid) /);
    assert.ok(!isAdmissible(inst), `refused an admissible identity: ${(e as Error).message}`);
    return undefined;
  }
}

// ---------------------------------------------------------------- unit files

/** Quadlet splits these on whitespace and unquotes them, so they must hold neither. */
const WORD_KEYS = [
  "Image",
  "Pull",
  "ContainerName",
  "Label",
  "Volume",
  "AddDevice",
  "Network",
  "User",
  "Group",
  "Environment",
];
/** Every key we write, by section; anything else in a quadlet is a value that escaped into a line of its own. */
const UNIT_KEYS: Record<string, string[]> = {
  Unit: ["Description", "BindsTo", "After"],
  Container: [...WORD_KEYS, "Exec"],
  Service: ["ExecStartPre", "Restart", "RestartSec", "TimeoutStartSec"],
  Install: ["WantedBy"],
};

/** The keys and values of a quadlet, after checking each line is one systemd reads as we mean it. */
function unitLines(content: string, inst: Instance): [string, string][] {
  assert.ok(content.endsWith("\n"), "a unit file ends with a newline");
  const lines = content.slice(0, -1).split("\n");
  assert.equal(lines[0], MANAGED_HEADER);
  assert.equal(lines[1], ownerLineOf(inst));
  let section: string | undefined;
  const out: [string, string][] = [];
  const seen = new Set<string>();
  for (const line of lines.slice(2)) {
    if (line === "") continue;
    const head = /^\[([A-Za-z]+)\]$/.exec(line);
    if (head) {
      assert.ok(head[1] in UNIT_KEYS && !seen.has(head[1]), `unexpected section ${line}`);
      seen.add(head[1]);
      section = head[1];
      continue;
    }
    const kv = /^([A-Za-z]+)=(.*)$/.exec(line);
    assert.ok(kv && section, `not a key=value line in a section: ${JSON.stringify(line)}`);
    const [, key, value] = kv;
    assert.ok(UNIT_KEYS[section].includes(key), `${key}= is not a key we write in [${section}]`);
    // deno-lint-ignore no-control-regex
    assert.doesNotMatch(value, /[\x00-\x1f\x7f]/, `control character in ${key}=`);
    assert.match(value, /^(?:[^%]|%%)*$/, `an undoubled % in ${key}=${value} is a systemd specifier`);
    assert.ok(!value.endsWith("\\"), `${key}= ends in a backslash, which continues the line`);
    if (WORD_KEYS.includes(key)) assert.doesNotMatch(value, /[\s"'\\]/, `${key}= would be split or unquoted`);
    out.push([key, value]);
  }
  return out;
}

function ownerLineOf(id: Identity): string {
  return `${OWNER_PREFIX}namespace=${id.namespace} set=${id.setName} exporter=${id.name} uid=${id.uid}`;
}

function checkQuadlet(r: RenderedInstance, inst: Instance, role: "runtime" | "exporter") {
  const f = r.files.find((f) => f.path === quadletPath(`${inst.name}-${role}`));
  assert.ok(f, `no ${role} quadlet`);
  const kv = unitLines(f.content, inst);
  const all = (k: string) => kv.filter(([key]) => key === k).map(([, v]) => v);
  const image = inst.params.images[role];
  assert.deepEqual(all("Image"), [image.image]);
  assert.deepEqual(all("ContainerName"), [`${inst.name}-${role}`]);
  assert.deepEqual(all("AddDevice"), [
    ...(inst.params.runtime.kvm ? ["-/dev/kvm"] : []),
    ...inst.params.runtime.devices,
  ]);
  assert.deepEqual(all("Label"), [
    `jumpstarter.dev/exporter=${inst.name}`,
    `jumpstarter.dev/namespace=${inst.namespace}`,
    `qemu-ssh.jumpstarter.dev/exporterset=${inst.setName}`,
    `qemu-ssh.jumpstarter.dev/uid=${inst.uid}`,
    `qemu-ssh.jumpstarter.dev/role=${role}`,
    ...(role === "runtime" ? [`qemu-ssh.jumpstarter.dev/disk-bytes=${inst.params.diskBytes}`] : []),
  ]);
  if (role === "exporter") {
    assert.deepEqual(all("Exec"), [`jmp run --exporter-config ${CONFIG_DIR}/${inst.name}.yaml`]);
    assert.deepEqual(all("Restart"), [inst.exitOnLeaseEnd ? "on-failure" : "always"]);
    assert.deepEqual(all("User"), ["65532"]);
    assert.deepEqual(all("Environment"), ["JUMPSTARTER_LAUNCHER_SOCKET=/shared/launcher.sock"]);
  } else {
    assert.deepEqual(all("User"), ["0"]);
    // the staging command is split on whitespace by systemd: every value in it is one word
    const [stage] = all("ExecStartPre");
    const exporterImage = inst.params.images.exporter.image;
    const [sh, script, pull, ...args] = stage.split(" ");
    assert.deepEqual([sh, script], ["/bin/sh", STAGE_SCRIPT]);
    assert.match(pull, /^(always|missing|never|newer)$/, "a policy of `podman run --pull`, as stage.sh takes it");
    assert.deepEqual(args, [exporterImage, `jumpstarter-${inst.name}-shared`, `${inst.name}-stage`]);
    assert.doesNotMatch(exporterImage, /[\s"'\\]/);
  }
}

// ---------------------------------------------------------------- ExporterConfig

type Json = Record<string, unknown>;
const isMap = (v: unknown): v is Json => typeof v === "object" && v !== null && !Array.isArray(v);

/**
 * The ExporterConfig as documented: the template's drivers as written, the QEMU driver's config over the class's
 * defaults with the launcher socket ours and an ssh forward unless the template has one, a `power` alias of the first
 * QEMU driver's power unless a driver has that name, and a tcp driver following that forward unless the template has
 * its own.
 */
export function intendedConfig(inst: Instance): Json {
  const p = inst.params;
  let sshPort: unknown = SSH_FORWARD_PORT;
  const exported: [string, unknown][] = inst.drivers.map((d) => {
    if (d.ref !== undefined) return [d.name, { ref: d.ref }];
    const config = isMap(d.config) ? d.config : {};
    if (d.type !== QEMU_DRIVER_TYPE) return [d.name, { type: d.type, config }];
    const hostfwd = obj([
      ["ssh", { protocol: "tcp", hostaddr: "127.0.0.1", hostport: SSH_FORWARD_PORT, guestport: 22 }],
      ...Object.entries(isMap(config.hostfwd) ? config.hostfwd : {}),
    ]);
    const port = isMap(hostfwd.ssh) ? hostfwd.ssh.hostport : undefined;
    if (Number.isInteger(port)) sshPort = port;
    return [d.name, {
      type: d.type,
      config: obj([
        ["arch", p.arch],
        ["smp", p.cpu],
        ["mem", p.memory && qemuQuantity(p.memory)],
        ["disk_size", p.storage && qemuQuantity(p.storage)],
        ...Object.entries(config),
        ["hostfwd", hostfwd],
        ...("default_partitions" in config
          ? []
          : [["default_partitions", firmwareFor("arch" in config ? config.arch : p.arch)]]),
        ["launcher_socket", LAUNCHER_SOCKET],
      ] as [string, unknown][]),
    }];
  });
  const qemu = inst.drivers.find((d) => d.ref === undefined && d.type === QEMU_DRIVER_TYPE);
  if (qemu && !inst.drivers.some((d) => d.name === "power")) exported.push(["power", { ref: `${qemu.name}.power` }]);
  const hasTcp = inst.drivers.some((d) => d.name === "tcp" || (d.ref === undefined && d.type === TCP_DRIVER_TYPE));
  if (!hasTcp) exported.push(["tcp", { type: TCP_DRIVER_TYPE, config: { host: "127.0.0.1", port: sshPort } }]);
  return {
    apiVersion: "jumpstarter.dev/v1alpha1",
    kind: "ExporterConfig",
    metadata: { namespace: inst.namespace, name: inst.name },
    endpoint: inst.endpoint,
    token: inst.token,
    tls: { ca: Buffer.from(inst.caBundle, "utf8").toString("base64"), insecure: false },
    exitOnLeaseEnd: inst.exitOnLeaseEnd,
    export: obj(exported),
  };
}

/** Upstream's firmware defaults: AAVMF for aarch64 guests, OVMF for any other. */
const firmwareFor = (arch: unknown) => {
  const [dir, prefix] = arch === "aarch64" ? ["/usr/share/AAVMF", "AAVMF"] : ["/usr/share/edk2/ovmf", "OVMF"];
  return { "OVMF_CODE.fd": `${dir}/${prefix}_CODE.fd`, "OVMF_VARS.fd": `${dir}/${prefix}_VARS.fd` };
};

/** The config file's text as the host stores it: the UTF-8 the apply script writes, read back. */
export function configOnHost(r: RenderedInstance, inst: Instance): string {
  const f = r.files.find((f) => f.path.endsWith(`/${inst.name}.yaml`));
  assert.ok(f, "no config file");
  return Buffer.from(Buffer.from(f.content, "utf8")).toString("utf8");
}

/**
 * Strings as a plain YAML 1.1 scalar PyYAML cannot load (`=` and `<<` are tags it has no constructor for, a tab
 * stops its scanner), and characters a 1.1 reader takes for line breaks wherever they stand unescaped.
 */
const PYYAML_PLAIN_BAD = /\t|^(?:=|<<)$/;
const YAML11_BREAKS = /[\u0085\u2028\u2029]/;
/** What PyYAML's reader refuses anywhere in a stream, quoted or not: only escapes can carry these. */
const PYYAML_UNREADABLE = /[\x7f-\x84\x86-\x9f\ufffe\uffff]/;

// ---------------------------------------------------------------- apply script

/**
 * The apply script's file steps (ownership checks, directories, file writes and links), run by a real shell (dash, the
 * strictest POSIX shell a host is likely to run `sh -s` with) with those commands replaced by a recorder: what it
 * records is what the header's quoting delivered.
 */
const FILE_STEPS = `${recorder(["check_owner", "link", "mkdir", "chmod", "chown"])}put() { rec put "$@"; changed=1; }
each_file check_paths
each_file make_dirs
rt_changed=0 ex_changed=0 cfg_changed=0
each_file write_file
rec vars "$UID_" "$RT" "$EX" "$RTQ" "$EXQ"
`;

function expectedCalls(r: RenderedInstance): string[][] {
  const dir = (p: string) => p.slice(0, p.lastIndexOf("/"));
  const base = (u: string) => u.replace(/\.service$/, "");
  return [
    ...r.files.flatMap((f) => [f.path, ...f.links]).map((p) => ["check_owner", p, r.uid]),
    ...r.files.flatMap((f) => [
      ...[f.path, ...f.links].flatMap((p) => [["mkdir", "-p", dir(p)], ...f.secret ? [["chmod", "0700", dir(p)]] : []]),
      ...f.owner !== 0 ? [["chown", `${f.owner}:${f.owner}`, dir(f.path)]] : [],
    ]),
    ...r.files.flatMap((f) => [
      [
        "put",
        f.path,
        f.mode.toString(8),
        String(f.owner),
        createHash("sha256").update(f.content, "utf8").digest("hex"),
        Buffer.from(f.content, "utf8").toString("base64"),
      ],
      ...f.links.map((l) => ["link", f.path, l]),
    ]),
    [
      "vars",
      r.uid,
      r.units.runtime,
      r.units.exporter,
      quadletPath(base(r.units.runtime)),
      quadletPath(base(r.units.exporter)),
    ],
  ];
}

/** The script with the content of every file write (its hash and base64 payload) blanked out. */
const withoutPayloads = (script: string) =>
  script.replace(/^((?:FILES=')?[a-z]+ [01] [0-7]+ [0-9]+) [0-9a-f]{64} [A-Za-z0-9+/=]+ /gm, "$1 HASH PAYLOAD ");

const applyOptions = fc.record({
  kvmRequired: fc.boolean(),
  keepExited: fc.boolean(),
  deferRestart: fc.boolean(),
}) as fc.Arbitrary<ApplyOptions>;

/** Identities that are plain words, so every place the script puts them can be found and checked. */
const MARKERS: Identity = { namespace: "zqxns0", name: "zqxname0", setName: "zqxset0", uid: "zqxuid0" };

// ---------------------------------------------------------------- properties

export const RENDER_PROPERTIES: NamedProperty[] = [
  {
    name: "(3) renderInstance refuses only bad names; unit files are comments, sections and known Key=Value lines",
    runs: 300,
    property: () =>
      fc.property(renderCase, (inst) => {
        const r = tryRender(inst);
        if (!r) return;
        for (const v of [inst.namespace, inst.name, inst.setName]) {
          assert.ok(isSafeName(v), `rendered with ${JSON.stringify(v)} as a name`);
        }
        assert.ok(isSafeUid(inst.uid), `rendered with ${JSON.stringify(inst.uid)} as the uid`);
        for (const f of r.files) {
          for (const p of [f.path, ...f.links]) {
            assert.match(
              p,
              new RegExp(`^(${CONFIG_DIR}|${QUADLET_DIR})/[^/]+(/[^/]+)?$`),
              `file outside our dirs: ${p}`,
            );
            assert.ok(!p.split("/").some((s) => s === "." || s === ".."), p);
          }
        }
        checkQuadlet(r, inst, "runtime");
        checkQuadlet(r, inst, "exporter");
        // the host scripts find the owner in the first two lines of every file: there and nowhere else
        for (const f of r.files) {
          const lines = f.content.split("\n");
          assert.deepEqual(lines.slice(0, 2), [MANAGED_HEADER, ownerLineOf(inst)]);
          const uid = /^# qemu-ssh\.jumpstarter\.dev\/owner: .* uid=([^ ]*)$/.exec(lines[1])?.[1];
          assert.equal(uid, inst.uid);
        }
      }),
  },
  {
    name: "(4) the ExporterConfig parses back to exactly the intended object",
    runs: 300,
    property: () =>
      fc.property(renderCase, (inst) => {
        const r = tryRender(inst);
        if (!r) return;
        assert.deepEqual(parse(configOnHost(r, inst)), intendedConfig(inst));
      }),
  },
  {
    name: "(4b) the ExporterConfig reads the same as YAML 1.1, as the exporter's PyYAML reads it",
    runs: 300,
    property: () =>
      fc.property(renderCase, (inst) => {
        const r = tryRender(inst);
        if (!r) return;
        const text = configOnHost(r, inst);
        const raw = YAML11_BREAKS.exec(text);
        assert.equal(raw, null, `unescaped ${JSON.stringify(raw?.[0])}: a line break to a YAML 1.1 reader`);
        const unreadable = PYYAML_UNREADABLE.exec(text);
        assert.equal(unreadable, null, `unescaped ${JSON.stringify(unreadable?.[0])}: PyYAML refuses to read it`);
        // a date as a key is only stringified, which the comparison below reports anyway
        const doc = parseDocument(text, { version: "1.1", logLevel: "error" });
        visit(doc, {
          Scalar(_, n) {
            if (n.type === Scalar.PLAIN && typeof n.source === "string" && PYYAML_PLAIN_BAD.test(n.source)) {
              assert.fail(`plain scalar ${JSON.stringify(n.source)} does not load in PyYAML`);
            }
          },
        });
        assert.deepEqual(doc.toJS(), intendedConfig(inst));
      }),
  },
  {
    name: "(4c) the ExporterConfig keeps every driver, whatever its name and config keys",
    runs: 300,
    property: () =>
      fc.property(renderCase, validDrivers, (inst, drivers) => {
        const r = tryRender({ ...inst, drivers });
        if (!r) return;
        const names = Object.keys(parse(configOnHost(r, inst)).export);
        for (const d of drivers) assert.ok(names.includes(d.name), `driver ${JSON.stringify(d.name)} lost`);
      }),
  },
  {
    name:
      "(5) the apply (and remove) script passes sh -n, and a real shell delivers every quoted value and file intact",
    // each case starts three shells
    runs: 100,
    property: () =>
      fc.asyncProperty(renderCase, applyOptions, async (inst, opts) => {
        const r = tryRender(inst);
        if (!r) return;
        const script = applyScript(r, opts);
        const syntax = await runShell("dash", script, ["-n"]);
        assert.equal(syntax.code, 0, `sh -n: ${syntax.stderr}`);
        const removal = await runShell("dash", removeScript(r.name, { uid: r.uid }), ["-n"]);
        assert.equal(removal.code, 0, `sh -n on the remove script: ${removal.stderr}`);
        const run = await runShell("dash", definitions(script) + FILE_STEPS);
        assert.equal(run.code, 0, run.stderr);
        assert.deepEqual(records(run.stdout), expectedCalls(r));
      }),
  },
  {
    name: "(5b) endpoint, token, CA bundle and drivers reach the script only inside the config's base64 payload",
    runs: 300,
    property: () =>
      fc.property(renderCase, secrets, validDrivers, applyOptions, fc.uuid(), (inst, other, drivers, opts, tag) => {
        const r = tryRender(inst);
        if (!r) return;
        const marked = { ...inst, token: `SECRET-${tag}`, endpoint: `ENDPOINT-${tag}`, caBundle: `CA-${tag}` };
        const script = applyScript(renderInstance(marked), opts);
        for (const v of [marked.token, marked.endpoint, marked.caBundle]) assert.ok(!script.includes(v));
        const changed = applyScript(renderInstance({ ...inst, ...other, drivers }), opts);
        assert.equal(withoutPayloads(changed), withoutPayloads(applyScript(r, opts)));
      }),
  },
  {
    name: "(5c) names, namespace and uid reach the script only inside single quotes (and its first comment)",
    runs: 300,
    property: () =>
      fc.property(renderCase, applyOptions, (inst, opts) => {
        const r = tryRender(inst);
        if (!r) return;
        const marked = applyScript(renderInstance({ ...inst, ...MARKERS }), opts);
        // a comment line, then only assignments (values in single quotes), then the fixed text of the scripts
        const header = marked.slice(0, marked.indexOf(LIB_SH));
        assert.equal(marked.slice(header.length), LIB_SH + APPLY_SH);
        assert.equal(header.replace(/^[A-Z][A-Z0-9_]*='[^']*'\n/gm, ""), `# ${MARKERS.name}: apply\n`);
        // the same script with the real values in the markers' places, i.e. in the same quotes
        let expected = marked;
        for (const k of ["name", "namespace", "setName", "uid"] as const) {
          expected = expected.replaceAll(MARKERS[k], inst[k]);
        }
        assert.equal(withoutPayloads(applyScript(r, opts)), withoutPayloads(expected));
      }),
  },
];

// only as a test module of its own: the other property file and the bench import this one
if (Deno.mainModule === import.meta.url) registerProperties(RENDER_PROPERTIES);
