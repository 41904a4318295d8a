/**
 * Bad input, property-based: generated VirtualTargetClasses and ExporterSets with wrong types, huge numbers, hostile
 * unicode and shell, systemd and YAML metacharacters in every field, against the validation that stands between them
 * and a lab host. The generators and properties are exported: render_property_test.ts renders the accepted inputs,
 * and bench/property.ts runs every property at a much larger count with a fresh seed.
 *
 * Two input shapes matter. What reaches the controller went through the API server, so its shape follows the CRD
 * schema (the free-form `parameters` and driver `config` aside); `render` and `doctor` read manifest files, where any
 * field can hold anything YAML can say.
 */
import assert from "node:assert/strict";
import fc from "fast-check";
import type { DriverSpec, ExporterSet, VirtualTargetClass } from "../api/types.ts";
import { DEFAULT_IMAGES, KNOWN_ARCHES, mergeParameters, resolveParams } from "./params.ts";
import {
  DEFAULT_FS_OVERHEAD,
  DEFAULT_STORAGE_SIZE,
  diskVolumeBytes,
  type InstanceParams,
  QEMU_DRIVER_TYPE,
  qemuQuantity,
} from "../host/instance_params.ts";

// ---------------------------------------------------------------- running properties

export interface NamedProperty {
  name: string;
  /** Cases in the unit test suite; bench/property.ts runs more. */
  runs: number;
  property: () => fc.IRawProperty<unknown, boolean>;
}

function envNumber(name: string): number | undefined {
  try {
    const v = Deno.env.get(name);
    return v ? Number(v) : undefined;
  } catch {
    return undefined; // no --allow-env: the fixed defaults apply
  }
}

/** Fixed so a CI failure reproduces anywhere; QSP_PROPERTY_SEED (and QSP_PROPERTY_RUNS) explore further. */
export const TEST_SEED = envNumber("QSP_PROPERTY_SEED") ?? 0x5eed;

export function registerProperties(props: NamedProperty[]) {
  for (const p of props) {
    Deno.test(`property: ${p.name}`, async () => {
      const details = await fc.check(p.property(), {
        numRuns: envNumber("QSP_PROPERTY_RUNS") ?? p.runs,
        seed: TEST_SEED,
      });
      if (details.failed) {
        throw new Error(`${fc.defaultReportMessage(details)}\n\nreproduce with QSP_PROPERTY_SEED=${TEST_SEED}`);
      }
    });
  }
}

// ---------------------------------------------------------------- building blocks

/** Names an object literal's lookups find on Object.prototype. */
export const PROTO_KEYS = [
  "__proto__",
  "constructor",
  "toString",
  "valueOf",
  "hasOwnProperty",
  "isPrototypeOf",
  "__defineGetter__",
];

/** Strings that mean something to a shell, systemd, YAML (1.1 and 1.2), a terminal or a JavaScript object. */
export const NASTY = [
  "",
  " ",
  "\n",
  "\r",
  "\r\n",
  "\0",
  "\t",
  "\v",
  "\x1b[31m",
  "\x7f",
  "\u0085",
  "\u00a0",
  "\u2028",
  "\u2029",
  "\ufeff",
  "\u200b",
  "\u200f",
  "\u202e",
  "e\u0301",
  "\u0301",
  "😀",
  "👩‍👩‍👧",
  "\ud800",
  "İ",
  "$(reboot)",
  "`id`",
  "${IFS}",
  "$HOME",
  ";",
  "|",
  "&",
  "&&",
  ">",
  "<",
  "'",
  '"',
  "'\\''",
  "\\",
  "\\n",
  "*",
  "?",
  "~",
  "!",
  "%",
  "%n",
  "%%",
  "%h",
  "%{",
  "[Service]",
  "ExecStartPre=/bin/sh -c id",
  "=",
  ": ",
  ":",
  "#",
  " #",
  "---",
  "...",
  "!!python/object/apply:os.system",
  "&a",
  "*a",
  "? ",
  "- ",
  "{",
  "}",
  "[",
  "]",
  ",",
  "@",
  "|-",
  "yes",
  "on",
  "off",
  "NO",
  "null",
  "<<",
  "1:30",
  "2024-01-01",
  "0x10",
  "1_000",
  "1e308",
  "-0",
  ".nan",
  "9007199254740993",
  "22",
  " 22",
  "+22",
  "..",
  "/dev/../etc/shadow",
  "/",
  "-rf",
  "A",
  "a".repeat(64),
  "a".repeat(254),
];

const atom = fc.constantFrom(...NASTY);
/** Kept as constants: generating them would be slow and they only need to exist once. */
const huge = fc.constantFrom(
  "x".repeat(100_000),
  "%".repeat(10_000),
  "é".repeat(20_000),
  "'".repeat(5_000),
  `${"a.".repeat(300)}a`,
  "\n".repeat(1_000),
);

export const hostileString: fc.Arbitrary<string> = fc.oneof(
  // cross-shrinking lets a counterexample's 100,000-character string shrink to a short one
  { withCrossShrink: true },
  { weight: 8, arbitrary: atom },
  {
    weight: 8,
    arbitrary: fc.array(fc.oneof(atom, fc.string({ unit: "grapheme", maxLength: 3 })), { minLength: 2, maxLength: 6 })
      .map((a) => a.join("")),
  },
  { weight: 4, arbitrary: fc.string({ unit: "grapheme", maxLength: 20 }) },
  // lone surrogates and every other UTF-16 code unit
  { weight: 2, arbitrary: fc.string({ unit: "binary", maxLength: 20 }) },
  // rare, as a case holds dozens of strings and these cost time in every step
  { weight: 1, arbitrary: huge },
);
export const nonEmptyHostile = hostileString.filter((s) => s.length > 0);

/** A valid value with something hostile inserted: what slips past a check anchored at one end only. */
export function nearMiss(valid: fc.Arbitrary<string>): fc.Arbitrary<string> {
  return fc.tuple(valid, fc.nat(), atom).map(([s, i, a]) => {
    const at = i % (s.length + 1);
    return s.slice(0, at) + a + s.slice(at);
  });
}

/**
 * A map as JSON.parse and the yaml parser build it: every key an own property, `__proto__` included, which an
 * assignment would turn into a prototype under Node and fast-check's own generators may drop.
 */
export function obj(entries: Iterable<readonly [string, unknown]>): Record<string, unknown> {
  const o: Record<string, unknown> = {};
  for (const [k, v] of entries) {
    if (v !== undefined) {
      Object.defineProperty(o, k, { value: v, enumerable: true, writable: true, configurable: true });
    }
  }
  return o;
}

export const weirdNumber: fc.Arbitrary<number> = fc.oneof(
  fc.constantFrom(
    0,
    -0,
    -1,
    0.5,
    22.000001,
    65535,
    65536,
    1024,
    1025,
    2 ** 31,
    2 ** 53,
    2 ** 53 + 2,
    1e308,
    -1e308,
    5e-324,
    NaN,
    Infinity,
    -Infinity,
  ),
  fc.integer(),
  fc.double(),
);

const plainKey = fc.oneof(hostileString, fc.constantFrom("host", "name", "port", "ssh", "runtime", "hostfwd", "type"));

export function mapOf(value: fc.Arbitrary<unknown>, key: fc.Arbitrary<string> = plainKey, maxLength = 4) {
  return fc.array(fc.tuple(key, value), { maxLength }).map(obj);
}

const scalarJunk = fc.oneof(hostileString, weirdNumber, fc.boolean(), fc.constant(null));
/** Anything JSON or YAML can hold (NaN and the infinities come from YAML's .nan and .inf). */
export const anyValue: fc.Arbitrary<unknown> = fc.letrec((tie) => ({
  value: fc.oneof(
    { depthSize: "small", withCrossShrink: true },
    scalarJunk,
    fc.array(tie("value"), { maxLength: 3 }),
    mapOf(tie("value")),
  ),
})).value;

/** Not a string: what a field holds when someone forgot quotes, or quoted a number, or wrote a list. */
export const wrongType: fc.Arbitrary<unknown> = fc.oneof(
  weirdNumber,
  fc.boolean(),
  fc.constant(null),
  fc.array(anyValue, { maxLength: 3 }),
  mapOf(anyValue, plainKey, 2),
);

/** Mostly valid, else near-valid, hostile, or of the wrong type. */
function field(valid: fc.Arbitrary<unknown>, near: fc.Arbitrary<unknown>): fc.Arbitrary<unknown> {
  return fc.oneof(
    { weight: 5, arbitrary: valid },
    { weight: 2, arbitrary: near },
    { weight: 1, arbitrary: hostileString },
    { weight: 1, arbitrary: wrongType },
  );
}
const strField = (valid: fc.Arbitrary<string>) => field(valid, nearMiss(valid));

const absentOr = <T>(a: fc.Arbitrary<T>) => fc.option(a, { nil: undefined, freq: 2 });

// ---------------------------------------------------------------- valid values, by their own definition

const dnsLabel = fc.stringMatching(/^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$/);
export const validHostName: fc.Arbitrary<string> = fc.oneof(
  { withCrossShrink: true },
  fc.domain(),
  fc.ipV4(),
  fc.ipV6(),
  fc.array(dnsLabel, { minLength: 1, maxLength: 4 }).map((l) => l.join(".")).filter((s) => !/^[0-9.]+$/.test(s)),
  fc.constantFrom(
    "localhost",
    "LAB-HOST-01.Example.COM",
    "1a",
    "xn--bcher-kva.example",
    "::1",
    "fd00::5",
    "::ffff:10.0.0.5",
    `${"a".repeat(63)}.${"b".repeat(63)}.${"c".repeat(63)}.${"d".repeat(61)}`,
  ),
);
export const validUser = fc.oneof(
  fc.stringMatching(/^[a-z_][a-z0-9_.-]{0,31}$/),
  fc.constantFrom("root", "jumpstarter", "_svc", "a".repeat(32)),
);
export const validPort = fc.integer({ min: 1, max: 65535 });
const DEVICE_PATH = /^\/dev\/[A-Za-z0-9_.+-]+(\/[A-Za-z0-9_.+-]+)*$/;
const devicePath = fc.oneof(
  fc.stringMatching(DEVICE_PATH),
  fc.constantFrom("/dev/ttyUSB0", "/dev/bus/usb/001/002", "/dev/net/tun", "/dev/.hidden", "/dev/a..b", "/dev/c++"),
).filter((p) => p.split("/").every((s) => s !== "." && s !== ".."));
export const validDevice = fc.tuple(devicePath, fc.option(devicePath, { nil: undefined })).map(([h, c]) =>
  c ? `${h}:${c}` : h
);
const SIZE_UNITS: [string, number][] = [
  ["", 1],
  ["K", 1e3],
  ["M", 1e6],
  ["G", 1e9],
  ["T", 1e12],
  ["Ki", 2 ** 10],
  ["Mi", 2 ** 20],
  ["Gi", 2 ** 30],
  ["Ti", 2 ** 40],
];
export const MAX_MEMORY = 4 * 2 ** 40;
export const MAX_STORAGE = 64 * 2 ** 40;
/** A quantity of at least 1Mi and at most `max` bytes, in any unit. */
export const validQuantity = (max: number) =>
  fc.constantFrom(...SIZE_UNITS).chain(([unit, size]) =>
    fc.bigInt({ min: BigInt(Math.ceil(2 ** 20 / size)), max: BigInt(Math.floor(max / size)) }).map((n) => `${n}${unit}`)
  );
/** storage.fsOverhead: a percentage up to 100% (with up to three decimals), or a quantity, zero included. */
export const validOverhead = fc.oneof(
  fc.integer({ min: 0, max: 100_000 }).map((m) => `${m / 1000}%`),
  fc.constant("0"),
  validQuantity(MAX_STORAGE),
);
const refComponent = fc.stringMatching(/^[a-z0-9]{1,8}((\.|_|__|-{1,2})[a-z0-9]{1,8}){0,2}$/);
export const validImage: fc.Arbitrary<string> = fc.tuple(
  fc.option(
    fc.oneof(fc.domain(), fc.constantFrom("localhost:5000", "quay.io", "Registry.Example.com:443", "10.0.0.1:5000")),
  ),
  fc.array(refComponent, { minLength: 1, maxLength: 3 }),
  fc.option(fc.stringMatching(/^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$/)),
  fc.option(fc.stringMatching(/^[a-f0-9]{64}$/)),
).map(([reg, path, tag, digest]) =>
  `${reg ? `${reg}/` : ""}${path.join("/")}${tag ? `:${tag}` : ""}${digest ? `@sha256:${digest}` : ""}`
).filter((s) => s.length <= 512);
export const PULL_POLICIES = ["Always", "IfNotPresent", "Never"] as const;

// ---------------------------------------------------------------- parameters

const SECTIONS = {
  ssh: ["user", "port", "hostKeyPolicy"],
  host: ["name", "user", "port"],
  runtime: ["kvm", "devices", "host_network"],
  resources: ["cpu", "memory"],
  storage: ["size", "fsOverhead"],
} as const;
export const KNOWN_TOP = [...Object.keys(SECTIONS), "arch"];

const intField = (valid: fc.Arbitrary<number>) =>
  field(
    valid,
    fc.oneof(valid.map(String), valid.map((n) => n + 0.5), valid.map((n) => -n), weirdNumber, valid.map((n) => [n])),
  );

/** Any value, type or shape in each known parameter; typos next to them. */
function anyParamValues(): Record<string, Record<string, fc.Arbitrary<unknown>>> {
  return {
    ssh: {
      user: strField(validUser),
      port: intField(validPort),
      hostKeyPolicy: strField(fc.constantFrom("Strict", "AcceptNew")),
    },
    host: { name: strField(validHostName), user: strField(validUser), port: intField(validPort) },
    runtime: {
      kvm: field(fc.boolean(), fc.constantFrom("true", "false", "yes", 1, 0, "on")),
      devices: field(
        fc.array(validDevice, { maxLength: 3 }),
        fc.oneof(
          fc.array(fc.oneof(validDevice, nearMiss(validDevice), wrongType), { minLength: 1, maxLength: 3 }),
          validDevice,
          fc.array(validDevice, { minLength: 65, maxLength: 66 }),
        ),
      ),
      host_network: anyValue,
    },
    resources: {
      cpu: intField(fc.integer({ min: 1, max: 1024 })),
      memory: strField(validQuantity(MAX_MEMORY)),
    },
    storage: { size: strField(validQuantity(MAX_STORAGE)), fsOverhead: strField(validOverhead) },
  };
}

// near the known keys (and so suggested), never one of them
const typoKey = fc.constantFrom(
  "hostname",
  "hosts",
  "Host",
  "usr",
  "prot",
  "kvms",
  "device",
  "memroy",
  "sizes",
  "cpus",
);

function section(values: Record<string, fc.Arbitrary<unknown>>, wrongShape: boolean): fc.Arbitrary<unknown> {
  const entries = Object.entries(values).map(([k, v]) => absentOr(v).map((x) => [k, x] as const));
  const asMap = fc.tuple(fc.tuple(...entries), fc.array(fc.tuple(typoKey, anyValue), { maxLength: 1 }))
    .map(([known, extra]) => obj([...known, ...extra]));
  return wrongShape ? fc.oneof({ weight: 8, arbitrary: asMap }, { weight: 1, arbitrary: wrongType }) : asMap;
}

/** `spec.parameters`: any content, as the free-form field admits it even through the API server. */
export const anyParameters: fc.Arbitrary<unknown> = (() => {
  const v = anyParamValues();
  const secs = Object.entries(v).map(([name, fields]) =>
    absentOr(section(fields, true)).map((s) => [name, s] as const)
  );
  const arch = absentOr(strField(fc.constantFrom(...KNOWN_ARCHES))).map((a) => ["arch", a] as const);
  const unknown = fc.array(fc.tuple(fc.oneof(typoKey, hostileString.filter((k) => !KNOWN_TOP.includes(k))), anyValue), {
    maxLength: 2,
  });
  return fc.tuple(fc.tuple(...secs, arch), unknown).map(([known, extra]) => obj([...known, ...extra]));
})();

// ---------------------------------------------------------------- whole objects

/** Names as the API server admits them (DNS subdomains); a manifest file may hold anything. */
const k8sName = fc.stringMatching(/^[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?$/);
const fileName = fc.oneof({ weight: 3, arbitrary: k8sName }, { weight: 1, arbitrary: hostileString });
const stringMap = mapOf(hostileString, hostileString, 3);
/** Driver names as the CRD's pattern admits them, the names Object.prototype has included. */
export const driverName = fc.oneof(
  { weight: 4, arbitrary: fc.stringMatching(/^[A-Za-z_][A-Za-z0-9_-]{0,12}$/) },
  { weight: 1, arbitrary: fc.constantFrom("qemu", "tcp", "serial", "_", "a-", ...PROTO_KEYS) },
);
export const TCP_DRIVER_TYPE = "jumpstarter_driver_network.driver.TcpNetwork";

const hostfwdEntry = mapOf(
  anyValue,
  fc.constantFrom("protocol", "hostaddr", "hostport", "guestport", "ssh"),
  4,
);
/** A driver config: free-form, so anything goes inside, including what the QEMU enrichment reads. */
export const driverConfig = fc.tuple(
  mapOf(anyValue, fc.oneof(plainKey, fc.constantFrom("mem", "smp", "arch", "disk_size", "launcher_socket")), 3),
  fc.option(mapOf(fc.oneof(hostfwdEntry, anyValue), fc.oneof(fc.constant("ssh"), hostileString), 2), {
    nil: undefined,
  }),
).map(([c, fwd]) => fwd === undefined ? c : obj([...Object.entries(c), ["hostfwd", fwd]]));

/** A driver the API server admits: a name of the CRD's pattern, exactly one of type and ref, a map as config. */
export const schemaDriver: fc.Arbitrary<DriverSpec> = fc.tuple(
  driverName,
  fc.oneof(
    fc.constant({ type: QEMU_DRIVER_TYPE }),
    fc.constant({ type: TCP_DRIVER_TYPE }),
    nonEmptyHostile.map((type) => ({ type })),
    nonEmptyHostile.map((ref) => ({ ref })),
  ),
  absentOr(driverConfig),
).map(([name, kind, config]) => {
  const d: DriverSpec = { name, ...kind };
  if (config !== undefined && !("ref" in kind)) d.config = config;
  return d;
});
export const schemaDrivers = fc.uniqueArray(schemaDriver, { selector: (d) => d.name, maxLength: 3 });
/** Drivers resolveParams accepts: the QEMU driver's hostfwd, which the renderer merges into, is a map. */
export const validDrivers = fc.uniqueArray(
  schemaDriver.filter((d) => {
    const fwd = d.type === QEMU_DRIVER_TYPE ? d.config?.hostfwd : undefined;
    return fwd === undefined || (typeof fwd === "object" && fwd !== null && !Array.isArray(fwd));
  }),
  { selector: (d) => d.name, maxLength: 3 },
);

/** What a manifest file can put where a driver list goes. */
const manifestDrivers: fc.Arbitrary<unknown> = fc.oneof(
  { weight: 4, arbitrary: schemaDrivers },
  {
    weight: 2,
    arbitrary: fc.array(
      fc.oneof(
        schemaDriver,
        wrongType,
        fc.record({ name: fc.oneof(driverName, wrongType), type: fc.oneof(hostileString, wrongType) }, {
          requiredKeys: [],
        }),
        fc.record({ name: driverName, type: nonEmptyHostile, ref: nonEmptyHostile, config: wrongType }, {
          requiredKeys: ["name"],
        }),
      ),
      { maxLength: 3 },
    ),
  },
  { weight: 1, arbitrary: fc.oneof(hostileString, mapOf(anyValue), weirdNumber, fc.constant(null)) },
);

const imageRole = (schema: boolean) =>
  absentOr(
    fc.tuple(
      absentOr(schema ? fc.oneof(validImage, nearMiss(validImage), nonEmptyHostile) : strField(validImage)),
      absentOr(schema ? fc.constantFrom(...PULL_POLICIES) : strField(fc.constantFrom(...PULL_POLICIES))),
    ).map(([image, imagePullPolicy]) => obj([["image", image], ["imagePullPolicy", imagePullPolicy]])),
  );
const images = (schema: boolean): fc.Arbitrary<unknown> => {
  const m = fc.tuple(imageRole(schema), imageRole(schema)).map(([exporter, runtime]) =>
    obj([["exporter", exporter], ["runtime", runtime]])
  );
  return schema ? m : fc.oneof({ weight: 6, arbitrary: m }, { weight: 1, arbitrary: wrongType });
};

export interface Pair {
  cls: VirtualTargetClass;
  set: ExporterSet;
}

function pair(
  metaName: fc.Arbitrary<string>,
  params: fc.Arbitrary<unknown>,
  drivers: fc.Arbitrary<unknown>,
  imgs: fc.Arbitrary<unknown>,
  template: (labels: unknown, annotations: unknown, drivers: unknown) => unknown,
  labels: fc.Arbitrary<unknown>,
): fc.Arbitrary<Pair> {
  return fc.record({
    clsName: metaName,
    setName: metaName,
    ns: metaName,
    clsParams: absentOr(params),
    setParams: absentOr(params),
    clsImages: absentOr(imgs),
    setImages: absentOr(imgs),
    drivers: absentOr(drivers),
    labels: absentOr(labels),
    annotations: absentOr(labels),
    provisioner: fc.oneof(fc.constant("qemu-ssh.jumpstarter.dev"), nonEmptyHostile),
  }).map((g) => ({
    cls: {
      apiVersion: "virtualtarget.jumpstarter.dev/v1alpha1",
      kind: "VirtualTargetClass",
      metadata: { name: g.clsName, namespace: g.ns },
      spec: obj([["provisioner", g.provisioner], ["parameters", g.clsParams], ["images", g.clsImages]]),
    } as unknown as VirtualTargetClass,
    set: {
      apiVersion: "virtualtarget.jumpstarter.dev/v1alpha1",
      kind: "ExporterSet",
      metadata: { name: g.setName, namespace: g.ns },
      spec: obj([
        ["virtualTargetClassName", g.clsName],
        ["parameters", g.setParams],
        ["images", g.setImages],
        ["template", template(g.labels, g.annotations, g.drivers)],
      ]),
    } as unknown as ExporterSet,
  }));
}

const schemaTemplate = (labels: unknown, annotations: unknown, drivers: unknown) =>
  obj([
    ["metadata", obj([["labels", labels], ["annotations", annotations]])],
    ["spec", obj([["drivers", drivers]])],
  ]);

/** What the controller can be handed: the CRD's shape, hostile content, free-form parameters holding anything. */
export const schemaPair = pair(k8sName, anyParameters, schemaDrivers, images(true), schemaTemplate, stringMap);

/** What `render` and `doctor` can be handed from a file: anything in any field of the spec. */
export const manifestPair = pair(
  fileName,
  fc.oneof({ weight: 6, arbitrary: anyParameters }, { weight: 1, arbitrary: wrongType }),
  manifestDrivers,
  images(false),
  schemaTemplate,
  fc.oneof(stringMap, wrongType),
).chain((p) =>
  // the template itself, or its parts, of the wrong type now and then
  fc.oneof(
    { weight: 6, arbitrary: fc.constant(p) },
    {
      weight: 1,
      arbitrary: wrongType.map((t) => ({
        ...p,
        set: { ...p.set, spec: { ...p.set.spec, template: t } } as ExporterSet,
      })),
    },
    {
      weight: 1,
      arbitrary: wrongType.map((t) => ({
        ...p,
        set: { ...p.set, spec: { ...p.set.spec, template: obj([["spec", t]]) } } as ExporterSet,
      })),
    },
  )
);

// ---------------------------------------------------------------- valid inputs and what they must resolve to

const validSections = {
  ssh: { user: validUser, port: validPort, hostKeyPolicy: fc.constantFrom("Strict", "AcceptNew") },
  host: { name: validHostName, user: validUser, port: validPort },
  runtime: {
    kvm: fc.boolean(),
    devices: fc.oneof(
      { weight: 9, arbitrary: fc.array(validDevice, { maxLength: 3 }) },
      { weight: 1, arbitrary: fc.array(validDevice, { minLength: 64, maxLength: 64 }) },
    ),
  },
  resources: { cpu: fc.integer({ min: 1, max: 1024 }), memory: validQuantity(MAX_MEMORY) },
  storage: { size: validQuantity(MAX_STORAGE), fsOverhead: validOverhead },
};

const validParameters: fc.Arbitrary<Record<string, unknown>> = fc.tuple(
  ...Object.entries(validSections).map(([name, fields]) =>
    absentOr(section(fields, false)).map((s) => [name, s] as const)
  ),
  absentOr(fc.constantFrom(...KNOWN_ARCHES)).map((a) => ["arch", a] as const),
).map(obj);

const validImages = fc.tuple(
  ...(["exporter", "runtime"] as const).map((role) =>
    absentOr(
      fc.tuple(absentOr(validImage), absentOr(fc.constantFrom(...PULL_POLICIES))).map(([image, imagePullPolicy]) =>
        obj([["image", image], ["imagePullPolicy", imagePullPolicy]])
      ),
    ).map((r) => [role, r] as const)
  ),
).map(obj);

/**
 * Every value valid by its own definition (RFC 1123 names, IP addresses, POSIX user names, device paths under /dev,
 * quantities from 1Mi to the maximum, distribution references), the host named somewhere, drivers as the API server
 * admits them with hostile config, names, labels and annotations.
 */
export const validPair: fc.Arbitrary<Pair> = fc.tuple(
  pair(k8sName, validParameters, validDrivers, validImages, schemaTemplate, stringMap),
  validHostName,
  fc.boolean(),
).map(([p, name, onSet]) => {
  const holder = (onSet ? p.set : p.cls).spec as { parameters?: Record<string, unknown> };
  const others = [p.cls, p.set].map((o) => (o.spec.parameters as Record<string, Record<string, unknown>>)?.host?.name);
  if (others.every((n) => n === undefined)) {
    const params = holder.parameters ?? {};
    const host = (params.host as Record<string, unknown> | undefined) ?? {};
    holder.parameters = obj([...Object.entries(params), ["host", obj([...Object.entries(host), ["name", name]])]]);
  }
  // the class lets its sets override all they do here (the refusals have tests of their own), by exact device path
  const devices = own(own(p.set.spec.parameters, "runtime"), "devices");
  p.cls.spec.setOverrides = {
    host: true,
    user: true,
    port: true,
    devices: Array.isArray(devices) ? devices.map((d: string) => d.split(":")[0]) : [],
  };
  // and a set can only make host-key checking stricter
  const ssh = own(p.set.spec.parameters, "ssh") as Record<string, unknown> | undefined;
  if (ssh?.hostKeyPolicy === "AcceptNew" && own(own(p.cls.spec.parameters, "ssh"), "hostKeyPolicy") !== "AcceptNew") {
    delete ssh.hostKeyPolicy;
  }
  return p;
});

const own = (o: unknown, k: string): unknown =>
  typeof o === "object" && o !== null && !Array.isArray(o) && Object.hasOwn(o, k)
    ? (o as Record<string, unknown>)[k]
    : undefined;

/** The set's value where it has one, else the class's: how a per-field override is documented. */
function overridden(p: Pair, ...path: string[]): unknown {
  for (const params of [p.set.spec.parameters, p.cls.spec.parameters]) {
    let cur: unknown = params;
    for (const k of path) cur = own(cur, k);
    if (cur !== undefined) return cur;
  }
  return undefined;
}

export function expectedParams(p: Pair): InstanceParams {
  const get = (...path: string[]) => overridden(p, ...path);
  const image = (role: "exporter" | "runtime") => {
    const pick = (k: string) =>
      [p.set, p.cls].map((o) => own(own(o.spec.images, role), k)).find((v) => v !== undefined) as string | undefined;
    return { image: pick("image") ?? DEFAULT_IMAGES[role], pullPolicy: pick("imagePullPolicy") ?? "IfNotPresent" };
  };
  const out = {
    host: {
      name: get("host", "name"),
      user: get("host", "user") ?? get("ssh", "user") ?? "root",
      port: get("host", "port") ?? get("ssh", "port") ?? 22,
    },
    hostKeyPolicy: get("ssh", "hostKeyPolicy"),
    runtime: { kvm: get("runtime", "kvm") ?? false, devices: get("runtime", "devices") ?? [] },
    arch: get("arch"),
    cpu: get("resources", "cpu"),
    memory: get("resources", "memory"),
    storage: get("storage", "size"),
    diskBytes: diskVolumeBytes(
      (get("storage", "size") as string | undefined) ?? DEFAULT_STORAGE_SIZE,
      (get("storage", "fsOverhead") as string | undefined) ?? DEFAULT_FS_OVERHEAD,
    ),
    images: { exporter: image("exporter"), runtime: image("runtime") },
  };
  return JSON.parse(JSON.stringify(out));
}

// ---------------------------------------------------------------- checks shared by the properties

const OBJECTS = ["VirtualTargetClass", "ExporterSet"];
// C0 controls can forge a line or drive a terminal (ESC); a tab cannot, and neither can DEL, which JSON.stringify
// leaves as it is
// deno-lint-ignore no-control-regex
const CONTROL = /[\x00-\x08\x0a-\x1f]/;

/** Whether `field` (e.g. `spec.parameters.runtime.devices[2]`) names a value the object itself holds. */
export function holds(o: VirtualTargetClass | ExporterSet, field: string): boolean {
  let cur: unknown = o;
  for (const [, key, index] of field.matchAll(/([^.[\]]+)|\[(\d+)\]/g)) {
    if (index !== undefined) {
      if (!Array.isArray(cur) || Number(index) >= cur.length) return false;
      cur = cur[Number(index)];
    } else {
      if (typeof cur !== "object" || cur === null || Array.isArray(cur) || !Object.hasOwn(cur, key)) return false;
      cur = (cur as Record<string, unknown>)[key];
    }
  }
  return true;
}

function snapshot(p: Pair): string {
  // JSON loses NaN and -0 alike on both sides, which is fine for spotting a mutation
  return JSON.stringify(p, (_k, v) => typeof v === "number" && !Number.isFinite(v) ? String(v) : v);
}

/** Runs resolveParams and checks what holds for every outcome: well-formed errors that name the right object. */
export function checkResolve(p: Pair): ReturnType<typeof resolveParams> {
  const before = snapshot(p);
  const r = resolveParams(p.cls, p.set);
  assert.equal(snapshot(p), before, "resolveParams changed its input");
  if (r.ok) return r;
  assert.ok(r.errors.length > 0, "rejected without an error");
  for (const e of r.errors) {
    const o = e.object === "VirtualTargetClass" ? p.cls : p.set;
    assert.ok(OBJECTS.includes(e.object), `unknown object ${e.object}`);
    assert.equal(e.name, o.metadata.name ?? "", "the error names another object");
    assert.match(e.field, /^spec\.[A-Za-z]/, "field path not under spec.");
    assert.equal(typeof e.message, "string");
    assert.ok(e.message.trim().length > 0, "empty message");
    // a missing value is blamed on the class, where the documentation says to set it
    if (!e.message.startsWith("missing")) {
      assert.ok(holds(o, e.field), `${e.object} ${e.field} is blamed but that object does not set it`);
    }
  }
  return r;
}

// ---------------------------------------------------------------- properties

export const PARAMS_PROPERTIES: NamedProperty[] = [
  {
    name: "(1a) resolveParams never throws on schema-shaped input, and does not mutate it",
    runs: 300,
    property: () =>
      fc.property(schemaPair, (p) => {
        checkResolve(p);
      }),
  },
  {
    name: "(1b) resolveParams never throws on anything a manifest file can hold (render, doctor)",
    runs: 300,
    property: () =>
      fc.property(manifestPair, (p) => {
        resolveParams(p.cls, p.set);
      }),
  },
  {
    name: "(2) every error names the object and a field under spec. that it sets, with a message",
    runs: 300,
    property: () =>
      fc.property(schemaPair, (p) => {
        const r = checkResolve(p);
        for (const w of r.ok ? r.warnings : []) {
          assert.match(w, /^(VirtualTargetClass|ExporterSet) .*spec\./s, `warning names no object and field: ${w}`);
        }
      }),
  },
  {
    name: "(2a) messages and warnings are one line: user values in them are escaped",
    runs: 300,
    property: () =>
      fc.property(schemaPair, (p) => {
        const r = resolveParams(p.cls, p.set);
        for (const m of r.ok ? r.warnings : r.errors.map((e) => e.message)) {
          assert.doesNotMatch(m, CONTROL, `a raw control character in: ${JSON.stringify(m)}`);
        }
      }),
  },
  {
    name: "(2b) valid values are accepted and resolve to the set's value over the class's over the default",
    runs: 300,
    property: () =>
      fc.property(validPair, (p) => {
        const r = checkResolve(p);
        assert.ok(r.ok, `valid input rejected: ${JSON.stringify(!r.ok && r.errors, null, 1)}`);
        assert.deepEqual(r.params, expectedParams(p));
      }),
  },
  {
    name:
      "(2d) under a class's default setOverrides, whatever resolves keeps its user, port, devices and host-key rule",
    runs: 300,
    property: () =>
      fc.property(validPair, (p) => {
        p.cls.spec.setOverrides = undefined;
        const r = checkResolve(p);
        if (!r.ok) return;
        const cls = (...path: string[]) => path.reduce<unknown>((o, k) => own(o, k), p.cls.spec.parameters);
        assert.equal(r.params.host.user, cls("host", "user") ?? cls("ssh", "user") ?? "root");
        assert.equal(r.params.host.port, cls("host", "port") ?? cls("ssh", "port") ?? 22);
        const clsDevices = ((cls("runtime", "devices") ?? []) as string[]).map((d) => d.split(":")[0]);
        for (const d of r.params.runtime.devices) assert.ok(clsDevices.includes(d.split(":")[0]), `${d} got through`);
        if (r.params.hostKeyPolicy === "AcceptNew") assert.equal(cls("ssh", "hostKeyPolicy"), "AcceptNew");
      }),
  },
  {
    name: "(2c) an unknown key, whatever its name, is reported and changes nothing else",
    runs: 300,
    property: () =>
      fc.property(
        // mostly accepted inputs, as warnings only come with parameters
        fc.oneof({ weight: 3, arbitrary: validPair }, { weight: 1, arbitrary: schemaPair }),
        fc.oneof(fc.constantFrom(...PROTO_KEYS), hostileString),
        fc.oneof(anyValue, validParameters),
        fc.boolean(),
        fc.constantFrom(undefined, ...Object.keys(SECTIONS)),
        (p, key, value, onSet, where) => {
          const isMap = (v: unknown) => typeof v === "object" && v !== null && !Array.isArray(v);
          const known: readonly string[] = where ? SECTIONS[where as keyof typeof SECTIONS] : KNOWN_TOP;
          fc.pre(!known.includes(key));
          const target = onSet ? p.set : p.cls;
          const params: unknown = target.spec.parameters;
          fc.pre(params === undefined ? where === undefined : isMap(params));
          // a section that is not there yet would change how the other object's section merges
          fc.pre(where === undefined || isMap(own(params, where)));
          const base = resolveParams(p.cls, p.set);
          // structuredClone, like JSON.parse, keeps a "__proto__" key an own key
          const withKey = structuredClone(p);
          const t = onSet ? withKey.set : withKey.cls;
          const add = (m: unknown) => obj([...Object.entries(m ?? {}), [key, value]]);
          t.spec.parameters = where === undefined
            ? add(t.spec.parameters)
            : obj([...Object.entries(t.spec.parameters!), [where, add(own(t.spec.parameters, where))]]);
          const r = resolveParams(withKey.cls, withKey.set);
          assert.equal(r.ok, base.ok);
          if (r.ok && base.ok) assert.deepEqual(r.params, base.params, "an ignored key changed the parameters");
          if (!r.ok && !base.ok) assert.deepEqual(r.errors, base.errors, "an ignored key changed the errors");
          if (r.ok) {
            const who = `${onSet ? "ExporterSet" : "VirtualTargetClass"} ${target.metadata.name}`;
            // the key as written, or quoted so that it cannot break the line
            const said = [key, JSON.stringify(key)].map((k) =>
              `${who}: spec.parameters.${where ? `${where}.` : ""}${k} is not a known parameter`
            );
            assert.ok(
              r.warnings.some((w) => said.some((s) => w.startsWith(s))),
              `no warning about ${JSON.stringify(key)}`,
            );
          }
        },
      ),
  },
  {
    name: "(2d) mergeParameters: every key of either side is an own key of the result, the prototype untouched",
    runs: 500,
    property: () =>
      fc.property(
        mapOf(anyValue, fc.oneof(plainKey, fc.constantFrom(...PROTO_KEYS))),
        mapOf(anyValue, fc.oneof(plainKey, fc.constantFrom(...PROTO_KEYS))),
        (base, over) => {
          const before = JSON.stringify([base, over]);
          const m = mergeParameters(base, over);
          assert.equal(JSON.stringify([base, over]), before, "inputs mutated");
          assert.equal(Object.getPrototypeOf(m), Object.prototype, "the merge replaced the result's prototype");
          const keys = new Set([...Object.keys(base), ...Object.keys(over)]);
          assert.deepEqual(new Set(Object.keys(m)), keys);
          for (const k of Object.keys(over)) {
            const b = base[k];
            const isMap = (v: unknown) => typeof v === "object" && v !== null && !Array.isArray(v);
            if (!(Object.hasOwn(base, k) && isMap(b) && isMap(over[k]))) assert.equal(m[k], over[k]);
          }
        },
      ),
  },
  {
    name: "(2e) qemuQuantity: a size QEMU reads as at least the quantity, and less than 1Mi more",
    runs: 500,
    property: () =>
      fc.property(fc.oneof(validQuantity(MAX_MEMORY), validQuantity(MAX_STORAGE)), (q) => {
        const bytes = (s: string, units: [string, number][]) => {
          const m = /^([0-9]+)([A-Za-z]*)$/.exec(s)!;
          return BigInt(m[1]) * BigInt(units.find(([u]) => u === m[2])![1]);
        };
        const out = qemuQuantity(q);
        assert.match(out, /^[1-9][0-9]*[KMGT]$/, `${q} -> ${out}: not a size with a QEMU suffix`);
        // QEMU's suffixes are binary
        const qemu = bytes(out, [["K", 2 ** 10], ["M", 2 ** 20], ["G", 2 ** 30], ["T", 2 ** 40]]);
        const asked = bytes(q, SIZE_UNITS);
        assert.ok(qemu >= asked && qemu - asked < 2n ** 20n, `${q} (${asked} B) -> ${out} (${qemu} B)`);
      }),
  },
];

// only as a test module of its own: the other property file and the bench import this one
if (Deno.mainModule === import.meta.url) registerProperties(PARAMS_PROPERTIES);
