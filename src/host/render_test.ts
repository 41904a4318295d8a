import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import { parse } from "yaml";
import { floatingImage, instanceOf, pullOf, renderInstance, statedPullPolicy, unitValue } from "./render.ts";
import type { DriverSpec, ExporterSet, VirtualTargetClass } from "../api/types.ts";
import { PEM, seedInstance, seedParams } from "../../test/fixtures.ts";

const fileOf = (r: ReturnType<typeof renderInstance>, suffix: string) => {
  const f = r.files.find((f) => f.path.endsWith(suffix));
  assert.ok(f, `no file ending in ${suffix}`);
  return f;
};

Deno.test("the seed's example renders upstream's enriched ExporterConfig", () => {
  const r = renderInstance(seedInstance());
  const cfg = fileOf(r, ".yaml");
  assert.equal(cfg.path, "/etc/jumpstarter/exporters/aarch64-ssh-pool-x7k2p.d/aarch64-ssh-pool-x7k2p.yaml");
  assert.deepEqual(cfg.links, ["/etc/jumpstarter/exporters/aarch64-ssh-pool-x7k2p.yaml"]);
  assert.equal(cfg.mode, 0o600);
  assert.equal(cfg.owner, 65532, "the exporter runs as uid 65532 and must read its config");
  assert.equal(cfg.secret, true);
  assert.deepEqual(parse(cfg.content), {
    apiVersion: "jumpstarter.dev/v1alpha1",
    kind: "ExporterConfig",
    metadata: { namespace: "jumpstarter", name: "aarch64-ssh-pool-x7k2p" },
    endpoint: "grpc.jumpstarter.example.com:443",
    token: "eyJhbGciOiJSUzI1NiJ9.payload.signature",
    tls: { ca: Buffer.from(PEM).toString("base64"), insecure: false },
    exitOnLeaseEnd: true,
    export: {
      qemu: {
        type: "jumpstarter_driver_qemu.driver.Qemu",
        config: {
          arch: "aarch64",
          smp: 4,
          mem: "4G",
          disk_size: "16G",
          default_partitions: {
            "OVMF_CODE.fd": "/usr/share/AAVMF/AAVMF_CODE.fd",
            "OVMF_VARS.fd": "/usr/share/AAVMF/AAVMF_VARS.fd",
          },
          launcher_socket: "/shared/launcher.sock",
          hostfwd: { ssh: { protocol: "tcp", hostaddr: "127.0.0.1", hostport: 2222, guestport: 22 } },
        },
      },
      // upstream main's alias: `j power on` as with its in-cluster exporters
      power: { ref: "qemu.power" },
      tcp: { type: "jumpstarter_driver_network.driver.TcpNetwork", config: { host: "127.0.0.1", port: 2222 } },
    },
  });
  assert.deepEqual(cfg.content.split("\n").slice(0, 2), [
    "# Managed by qemu-ssh.jumpstarter.dev; do not edit.",
    "# qemu-ssh.jumpstarter.dev/owner: namespace=jumpstarter set=aarch64-ssh-pool exporter=aarch64-ssh-pool-x7k2p " +
    "uid=0b7e6c1a-5f7d-4a8e-9c39-2f1d7e0a6b11",
  ]);
  assert.equal(r.volume, "jumpstarter-aarch64-ssh-pool-x7k2p-shared");
  assert.deepEqual(r.disk, {
    volume: "jumpstarter-aarch64-ssh-pool-x7k2p-disk",
    image: "/var/lib/qemu-ssh.jumpstarter.dev/disks/aarch64-ssh-pool-x7k2p.img",
    bytes: 18023 * 2 ** 20,
  });
  assert.equal(r.uid, "0b7e6c1a-5f7d-4a8e-9c39-2f1d7e0a6b11");
  assert.deepEqual(r.units, {
    runtime: "aarch64-ssh-pool-x7k2p-runtime.service",
    exporter: "aarch64-ssh-pool-x7k2p-exporter.service",
  });
  assert.deepEqual(r.files.map((f) => [f.path, f.mode.toString(8)]), [
    ["/etc/jumpstarter/exporters/aarch64-ssh-pool-x7k2p.d/aarch64-ssh-pool-x7k2p.yaml", "600"],
    ["/etc/containers/systemd/aarch64-ssh-pool-x7k2p-runtime.container", "644"],
    ["/etc/containers/systemd/aarch64-ssh-pool-x7k2p-exporter.container", "644"],
  ]);
});

Deno.test("template config wins over class defaults, except launcher_socket; user hostfwd entries are kept", () => {
  const r = renderInstance(seedInstance({
    exitOnLeaseEnd: false,
    caBundle: "",
    drivers: [
      {
        name: "qemu",
        type: "jumpstarter_driver_qemu.driver.Qemu",
        config: {
          mem: "2G",
          launcher_socket: "/tmp/elsewhere.sock",
          hostfwd: { http: { protocol: "tcp", hostaddr: "127.0.0.1", hostport: 8080, guestport: 80 } },
        },
      },
      { name: "power", ref: "shared-power" },
      { name: "serial", type: "jumpstarter_driver_pyserial.driver.PySerial", config: { url: "/dev/ttyUSB0" } },
    ],
  }));
  const cfg = parse(fileOf(r, ".yaml").content);
  assert.equal(cfg.exitOnLeaseEnd, false);
  assert.deepEqual(cfg.tls, { ca: "", insecure: false });
  assert.deepEqual(cfg.export.qemu.config, {
    arch: "aarch64",
    smp: 4,
    mem: "2G",
    disk_size: "16G",
    default_partitions: {
      "OVMF_CODE.fd": "/usr/share/AAVMF/AAVMF_CODE.fd",
      "OVMF_VARS.fd": "/usr/share/AAVMF/AAVMF_VARS.fd",
    },
    launcher_socket: "/shared/launcher.sock",
    hostfwd: {
      ssh: { protocol: "tcp", hostaddr: "127.0.0.1", hostport: 2222, guestport: 22 },
      http: { protocol: "tcp", hostaddr: "127.0.0.1", hostport: 8080, guestport: 80 },
    },
  });
  assert.deepEqual(cfg.export.power, { ref: "shared-power" });
  assert.deepEqual(cfg.export.serial, {
    type: "jumpstarter_driver_pyserial.driver.PySerial",
    config: { url: "/dev/ttyUSB0" },
  });
  assert.deepEqual(Object.keys(cfg.export), ["qemu", "power", "serial", "tcp"]);
});

Deno.test("the tcp driver is not added twice, and follows a moved ssh forward", () => {
  const qemu = { name: "qemu", type: "jumpstarter_driver_qemu.driver.Qemu" };
  for (
    const other of [
      { name: "tcp", type: "jumpstarter_driver_network.driver.TcpNetwork", config: { host: "10.0.0.1", port: 22 } },
      { name: "ssh-port", type: "jumpstarter_driver_network.driver.TcpNetwork", config: { host: "127.0.0.1" } },
    ]
  ) {
    const cfg = parse(fileOf(renderInstance(seedInstance({ drivers: [qemu, other] })), ".yaml").content);
    assert.deepEqual(Object.keys(cfg.export), ["qemu", other.name, "power"]);
    assert.deepEqual(cfg.export[other.name].config, other.config);
  }
  const moved = renderInstance(seedInstance({
    drivers: [{ ...qemu, config: { hostfwd: { ssh: { protocol: "tcp", hostaddr: "127.0.0.1", hostport: 2200 } } } }],
  }));
  assert.deepEqual(parse(fileOf(moved, ".yaml").content).export.tcp.config, { host: "127.0.0.1", port: 2200 });
  // no params beyond the host: no defaults invented, only the socket, the forward and upstream's firmware
  const bare = renderInstance(
    seedInstance({ params: { ...seedParams, arch: undefined, cpu: undefined, memory: undefined, storage: undefined } }),
  );
  const bareQemu = parse(fileOf(bare, ".yaml").content).export.qemu.config;
  assert.deepEqual(Object.keys(bareQemu).sort(), ["default_partitions", "hostfwd", "launcher_socket"]);
  assert.deepEqual(bareQemu.default_partitions, {
    "OVMF_CODE.fd": "/usr/share/edk2/ovmf/OVMF_CODE.fd",
    "OVMF_VARS.fd": "/usr/share/edk2/ovmf/OVMF_VARS.fd",
  });
});

Deno.test("the power alias: ref to the first QEMU driver's power unless a driver is named power, none without QEMU", () => {
  const exported = (drivers: DriverSpec[]) =>
    parse(fileOf(renderInstance(seedInstance({ drivers })), ".yaml").content).export;
  const vm = { name: "vm", type: "jumpstarter_driver_qemu.driver.Qemu" };
  assert.deepEqual(exported([vm]).power, { ref: "vm.power" });
  assert.deepEqual(exported([{ name: "other", ref: "x" }, vm, { ...vm, name: "vm2" }]).power, { ref: "vm.power" });
  const own = { name: "power", type: "jumpstarter_driver_power.driver.MockPower" };
  assert.deepEqual(exported([vm, own]).power, { type: own.type, config: {} });
  const serial = { name: "serial", type: "jumpstarter_driver_pyserial.driver.PySerial" };
  assert.deepEqual(Object.keys(exported([serial])), ["serial", "tcp"]);
});

Deno.test("default_partitions follow the template's arch, and the template's own are kept", () => {
  const qemu = (config: Record<string, unknown>) =>
    parse(
      fileOf(
        renderInstance(
          seedInstance({ drivers: [{ name: "qemu", type: "jumpstarter_driver_qemu.driver.Qemu", config }] }),
        ),
        ".yaml",
      ).content,
    ).export.qemu.config;
  assert.equal(qemu({ arch: "x86_64" }).default_partitions["OVMF_CODE.fd"], "/usr/share/edk2/ovmf/OVMF_CODE.fd");
  assert.deepEqual(qemu({ default_partitions: { "OVMF_CODE.fd": "/fw/code.fd" } }).default_partitions, {
    "OVMF_CODE.fd": "/fw/code.fd",
  });
});

Deno.test("quadlets: ownership, images, shared volume and netns, kvm to both, atomic-friendly config mount", () => {
  const r = renderInstance(seedInstance({
    params: {
      ...seedParams,
      runtime: { kvm: true, devices: ["/dev/ttyUSB0", "/dev/bus/usb/001/002:/dev/usb0"] },
      images: {
        exporter: { image: "registry.example.com/jumpstarter:0.7", pullPolicy: "Always" },
        runtime: { image: "quay.io/jumpstarter-dev/virtual/qemu-runtime:latest", pullPolicy: "Never" },
      },
    },
  }));
  const n = "aarch64-ssh-pool-x7k2p";
  const rt = fileOf(r, "-runtime.container");
  const ex = fileOf(r, "-exporter.container");
  for (const f of [rt, ex]) {
    assert.equal(f.mode, 0o644);
    assert.equal(f.secret, false);
    const lines = f.content.split("\n");
    assert.equal(lines[0], "# Managed by qemu-ssh.jumpstarter.dev; do not edit.");
    assert.equal(
      lines[1],
      `# qemu-ssh.jumpstarter.dev/owner: namespace=jumpstarter set=aarch64-ssh-pool exporter=${n} ` +
        "uid=0b7e6c1a-5f7d-4a8e-9c39-2f1d7e0a6b11",
    );
    for (
      const l of [
        `Volume=jumpstarter-${n}-shared:/shared:z`,
        // upstream main's driver keeps the guest's disks in /disk, where QEMU in the runtime opens them; the
        // exporter's mount gives the volume's root back to it at each start (U)
        `Volume=jumpstarter-${n}-disk:/disk:${f === ex ? "z,U" : "z"}`,
        "AddDevice=-/dev/kvm",
        "AddDevice=/dev/ttyUSB0",
        "AddDevice=/dev/bus/usb/001/002:/dev/usb0",
        `Label=jumpstarter.dev/exporter=${n}`,
        "Label=jumpstarter.dev/namespace=jumpstarter",
        "Label=qemu-ssh.jumpstarter.dev/uid=0b7e6c1a-5f7d-4a8e-9c39-2f1d7e0a6b11",
        "[Service]",
        "TimeoutStartSec=900",
        "[Install]",
        "WantedBy=multi-user.target",
      ]
    ) assert.ok(lines.includes(l), `${f.path} lacks ${l}:\n${f.content}`);
    // upstream weak point: limits need cgroup controllers a lab host may not delegate, and nobody asked for them
    assert.doesNotMatch(f.content, /^(Memory|PidsLimit|PodmanArgs)=/m);
  }
  assert.match(rt.content, /^Image=quay\.io\/jumpstarter-dev\/virtual\/qemu-runtime:latest$/m);
  assert.match(rt.content, /^Pull=never$/m);
  assert.match(rt.content, new RegExp(`^ContainerName=${n}-runtime$`, "m"));
  assert.doesNotMatch(rt.content, /^Network=/m, "the runtime keeps podman's default network (QEMU's user net)");
  assert.match(ex.content, /^Image=registry\.example\.com\/jumpstarter:0\.7$/m);
  assert.match(ex.content, /^Pull=always$/m);
  assert.match(ex.content, new RegExp(`^ContainerName=${n}-exporter$`, "m"));
  assert.match(ex.content, new RegExp(`^Network=${n}-runtime\\.container$`, "m"));
  assert.match(ex.content, new RegExp(`^BindsTo=${n}-runtime\\.service$`, "m"));
  assert.match(ex.content, new RegExp(`^After=${n}-runtime\\.service$`, "m"));
  assert.match(
    ex.content,
    new RegExp(`^Volume=/etc/jumpstarter/exporters/${n}\\.d:/etc/jumpstarter/exporters:ro,z$`, "m"),
  );
  assert.match(ex.content, new RegExp(`^Exec=jmp run --exporter-config /etc/jumpstarter/exporters/${n}\\.yaml$`, "m"));
  assert.deepEqual(r.devices, ["/dev/ttyUSB0", "/dev/bus/usb/001/002"]);
  // upstream's container contract: root runtime, non-root exporter, the launcher staged from the exporter image
  assert.match(rt.content, /^User=0$/m);
  assert.match(
    rt.content,
    new RegExp(`^Environment=JUMPSTARTER_EXEC_LOG_FIELDS=component=exporter,exporter=${n},namespace=jumpstarter$`, "m"),
  );
  assert.match(
    rt.content,
    new RegExp(
      `^ExecStartPre=/bin/sh /var/lib/qemu-ssh\\.jumpstarter\\.dev/stage-launcher\\.sh always ` +
        `registry\\.example\\.com/jumpstarter:0\\.7 jumpstarter-${n}-shared ${n}-stage$`,
      "m",
    ),
    "the exporter image (and its pull policy) supplies the runtime's launcher",
  );
  assert.match(ex.content, /^User=65532$/m);
  assert.match(ex.content, /^Group=65532$/m);
  assert.match(ex.content, /^Environment=JUMPSTARTER_LAUNCHER_SOCKET=\/shared\/launcher\.sock$/m);

  const noKvm = renderInstance(seedInstance({ params: { ...seedParams, runtime: { kvm: false, devices: [] } } }));
  for (const f of noKvm.files) assert.doesNotMatch(f.content, /AddDevice/);
  assert.match(fileOf(noKvm, "-runtime.container").content, /^Pull=newer$/m, "the seed's :latest, no policy stated");
});

Deno.test("kvm: the exporter gets /dev/kvm's group by number where the node is its group's, nowhere else", () => {
  const kvmInst = (kvm: boolean) => ({ ...seedInstance(), params: { ...seedParams, runtime: { kvm, devices: [] } } });
  const groupAdds = (r: ReturnType<typeof renderInstance>, role: string) =>
    fileOf(r, `-${role}.container`).content.split("\n").filter((l) => /group-add|GroupAdd/.test(l));
  const facts = (kvm: { mode: number; gid: number } | null) => ({ podman: "5.4.2", kvm });

  const debian = renderInstance(kvmInst(true), facts({ mode: 0o660, gid: 993 }));
  assert.deepEqual(groupAdds(debian, "exporter"), ["PodmanArgs=--group-add 993"]);
  assert.deepEqual(groupAdds(debian, "runtime"), [], "the runtime is root");
  assert.deepEqual(debian.facts, facts({ mode: 0o660, gid: 993 }), "the facts it was rendered for go along");
  const ex = fileOf(debian, "-exporter.container").content;
  assert.ok(ex.indexOf("AddDevice=-/dev/kvm") < ex.indexOf("PodmanArgs="), "the device stays");

  for (
    const [what, r] of [
      ["0666 (Fedora/RHEL)", renderInstance(kvmInst(true), facts({ mode: 0o666, gid: 36 }))],
      ["0600: refused by the apply instead", renderInstance(kvmInst(true), facts({ mode: 0o600, gid: 0 }))],
      ["no /dev/kvm", renderInstance(kvmInst(true), facts(null))],
      ["runtime.kvm: false", renderInstance(kvmInst(false), facts({ mode: 0o660, gid: 993 }))],
      ["facts not known yet", renderInstance(kvmInst(true))],
    ] as const
  ) {
    assert.deepEqual([...groupAdds(r, "exporter"), ...groupAdds(r, "runtime")], [], what);
  }
  assert.equal(renderInstance(kvmInst(true)).facts, undefined);
});

Deno.test("ExitAndReplace: an exporter that ends cleanly stays down; InPlaceReuse: it always comes back", () => {
  const replace = renderInstance(seedInstance({ exitOnLeaseEnd: true }));
  assert.match(fileOf(replace, "-exporter.container").content, /^Restart=on-failure$/m);
  assert.match(fileOf(replace, "-runtime.container").content, /^Restart=always$/m);
  const reuse = renderInstance(seedInstance({ exitOnLeaseEnd: false }));
  assert.match(fileOf(reuse, "-exporter.container").content, /^Restart=always$/m);
  assert.match(fileOf(reuse, "-runtime.container").content, /^Restart=always$/m);
});

Deno.test("hostile values cannot add a YAML key or a unit line", () => {
  const hostile = [
    "x\nexitOnLeaseEnd: false",
    "x\r\ntoken: stolen",
    '\'; $(reboot) `id` "quoted" %n %% \\',
    "---\nkind: Other",
    "a: b",
    "# qemu-ssh.jumpstarter.dev/owner: namespace=evil set=evil exporter=evil uid=evil",
    "\n# qemu-ssh.jumpstarter.dev/owner: namespace=evil set=evil exporter=evil uid=evil",
    "&anchor *alias !!python/object:os.system",
  ];
  const benign = renderInstance(seedInstance());
  for (const h of hostile) {
    const inst = seedInstance({
      endpoint: h,
      token: h,
      caBundle: h,
      drivers: [
        { name: "qemu", type: "jumpstarter_driver_qemu.driver.Qemu", config: { [h]: h, cpu: h, nested: { [h]: [h] } } },
      ],
    });
    const r = renderInstance(inst);
    const cfg = fileOf(r, ".yaml").content;
    const parsed = parse(cfg);
    assert.deepEqual(Object.keys(parsed), Object.keys(parse(fileOf(benign, ".yaml").content)));
    assert.equal(parsed.endpoint, h);
    assert.equal(parsed.token, h);
    assert.equal(Buffer.from(parsed.tls.ca, "base64").toString(), h);
    assert.equal(parsed.exitOnLeaseEnd, true);
    assert.deepEqual(parsed.export.qemu.config[h], h);
    assert.deepEqual(parsed.export.qemu.config.nested, { [h]: [h] });
    assert.equal(parsed.export.qemu.config.launcher_socket, "/shared/launcher.sock");
    // the ownership line the host scripts read is only ever in the first two lines, and stays ours
    const ownerLines = cfg.split("\n").filter((l) => l.startsWith("# qemu-ssh.jumpstarter.dev/owner:"));
    assert.equal(ownerLines.length, 1, cfg);
    assert.match(cfg.split("\n")[1], /uid=0b7e6c1a-/);
    // none of this reaches the unit files
    for (const suffix of ["-runtime.container", "-exporter.container"]) {
      assert.equal(fileOf(r, suffix).content, fileOf(benign, suffix).content);
    }
  }
});

Deno.test("identity fields that would become file, unit or container names are checked, not escaped", () => {
  for (
    const over of [
      { name: "a\nExecStartPre=/bin/sh" },
      { name: "../../etc/passwd" },
      { name: "a%n" },
      { name: "A" },
      { name: "x".repeat(201) },
      { namespace: "ns\n[Service]" },
      { namespace: "a.b" },
      { setName: "s%h" },
      { uid: "u id" },
      { uid: "" },
    ]
  ) {
    assert.throws(() => renderInstance(seedInstance(over)), /refusing to render/, JSON.stringify(over));
  }
});

Deno.test("unitValue doubles % and refuses control characters", () => {
  assert.equal(unitValue("100% %n %%"), "100%% %%n %%%%");
  assert.equal(unitValue("$(id) 'q' \"q\" \\"), "$(id) 'q' \"q\" \\");
  for (const bad of ["a\nb", "a\rb", "a\x00b", "a\tb", "a\x7fb"]) {
    assert.throws(() => unitValue(bad), /control character/);
  }
});

Deno.test("golden: the seed's instance renders exactly testdata/seed/* (UPDATE_GOLDEN=1 rewrites them)", async () => {
  const dir = new URL("./testdata/seed/", import.meta.url);
  const update = Deno.env.get("UPDATE_GOLDEN") === "1";
  if (update) await Deno.mkdir(dir, { recursive: true });
  for (const f of renderInstance(seedInstance()).files) {
    const golden = new URL(f.path.slice(f.path.lastIndexOf("/") + 1), dir);
    if (update) await Deno.writeTextFile(golden, f.content);
    assert.equal(f.content, await Deno.readTextFile(golden), `${f.path} differs from ${golden.pathname}`);
  }
});

Deno.test("floatingImage: :latest and untagged float, other tags and digests are pinned", () => {
  for (
    const image of [
      "quay.io/jumpstarter-dev/jumpstarter:latest",
      "quay.io/jumpstarter-dev/jumpstarter",
      "registry.example.com:5000/lab/jumpstarter",
      "registry.example.com:5000/lab/jumpstarter:latest",
      "jumpstarter",
    ]
  ) assert.equal(floatingImage(image), true, image);
  for (
    const image of [
      "quay.io/jumpstarter-dev/jumpstarter:0.9.0",
      "registry.example.com:5000/lab/jumpstarter:v1",
      "quay.io/jumpstarter-dev/jumpstarter@sha256:" + "a".repeat(64),
      "quay.io/jumpstarter-dev/jumpstarter:latest@sha256:" + "a".repeat(64),
      "registry.example.com:5000/lab/jumpstarter@sha256:" + "a".repeat(64),
    ]
  ) assert.equal(floatingImage(image), false, image);
});

Deno.test("pull policy: unstated, :latest is Pull=newer and pinned images missing; a stated policy is followed", () => {
  const LATEST = "quay.io/jumpstarter-dev/jumpstarter:latest";
  const PINNED = "quay.io/jumpstarter-dev/jumpstarter:0.9.0";
  const inst = (image: string, pullPolicy: "Always" | "IfNotPresent" | "Never", stated: boolean) =>
    seedInstance({
      params: { ...seedParams, images: { ...seedParams.images, exporter: { image, pullPolicy } } },
      statedPullPolicy: stated ? ["exporter"] : [],
    });
  const cases: [string, "Always" | "IfNotPresent" | "Never", boolean, string][] = [
    [LATEST, "IfNotPresent", false, "newer"],
    ["quay.io/jumpstarter-dev/jumpstarter", "IfNotPresent", false, "newer"],
    [PINNED, "IfNotPresent", false, "missing"],
    [`${PINNED}@sha256:${"b".repeat(64)}`, "IfNotPresent", false, "missing"],
    [LATEST, "IfNotPresent", true, "missing"],
    [LATEST, "Always", true, "always"],
    [LATEST, "Never", true, "never"],
    [PINNED, "Always", true, "always"],
    [PINNED, "Never", true, "never"],
  ];
  for (const [image, policy, stated, want] of cases) {
    const i = inst(image, policy, stated);
    assert.equal(pullOf(i, "exporter"), want, `${image} ${policy} stated=${stated}`);
    const r = renderInstance(i);
    // the exporter quadlet and the runtime's staging of the launcher from the exporter image agree
    assert.match(fileOf(r, "-exporter.container").content, new RegExp(`^Pull=${want}$`, "m"));
    assert.match(
      fileOf(r, "-runtime.container").content,
      new RegExp(`^ExecStartPre=/bin/sh \\S+/stage-launcher\\.sh ${want} `, "m"),
    );
  }
  // the runtime image follows its own policy, unstated here: the seed's :latest
  assert.match(fileOf(renderInstance(inst(PINNED, "Never", true)), "-runtime.container").content, /^Pull=newer$/m);
});

Deno.test("statedPullPolicy and instanceOf: what the set or the class states, per image", () => {
  const cls = { metadata: { name: "c", namespace: "ns" }, spec: {} } as VirtualTargetClass;
  const set = {
    metadata: { name: "s", namespace: "ns" },
    spec: { virtualTargetClassName: "c" },
  } as ExporterSet;
  assert.deepEqual(statedPullPolicy(cls, set), []);
  cls.spec.images = { runtime: { imagePullPolicy: "IfNotPresent" } };
  assert.deepEqual(statedPullPolicy(cls, set), ["runtime"]);
  set.spec.images = { exporter: { imagePullPolicy: "Always" } };
  assert.deepEqual(statedPullPolicy(cls, set), ["exporter", "runtime"]);
  set.spec.images = { exporter: { image: "x:latest" } };
  assert.deepEqual(statedPullPolicy(cls, set), ["runtime"], "an image alone states no policy");
  const inst = instanceOf(set, cls, seedParams, { name: "s-1", uid: "u", endpoint: "e:1", token: "t", caBundle: "" });
  assert.deepEqual(inst.statedPullPolicy, ["runtime"]);
  assert.equal(pullOf(inst, "runtime"), "missing", "IfNotPresent stated on a :latest image is followed");
  assert.equal(pullOf(inst, "exporter"), "newer");
});

Deno.test("per host Podman: the exporter's network and the keys each quadlet has, nothing else differs", () => {
  const inst = seedInstance({ params: { ...seedParams, runtime: { kvm: true, devices: [] } } });
  const n = inst.name;
  const quadlets = (podman: string) => {
    const r = renderInstance(inst, { podman, kvm: { mode: 0o660, gid: 993 } });
    return { rt: fileOf(r, "-runtime.container").content, ex: fileOf(r, "-exporter.container").content };
  };
  const newest = quadlets("5.4.2");
  for (const v of ["5.4.0", "6.0.0", "dev", ""]) assert.deepEqual(quadlets(v), newest, `${v}: the newest form`);
  assert.match(newest.ex, new RegExp(`^Network=${n}-runtime\\.container$`, "m"));
  assert.doesNotMatch(newest.ex, /^Requires=/m, "Network=<unit>.container makes quadlet add it");

  // 4.6 - 5.3: the runtime's container by name, with the ordering quadlet adds only for the unit form
  const v49 = quadlets("4.9.3");
  assert.deepEqual(quadlets("5.2.5"), v49);
  assert.deepEqual(quadlets("5.3.2"), v49);
  assert.equal(v49.rt, newest.rt, "the runtime's quadlet is the same");
  const [newLines, oldLines] = [newest.ex.split("\n"), v49.ex.split("\n")];
  assert.deepEqual(newLines.filter((l) => !oldLines.includes(l)), [`Network=${n}-runtime.container`]);
  assert.deepEqual(oldLines.filter((l) => !newLines.includes(l)), [
    `Requires=${n}-runtime.service`,
    `Network=container:${n}-runtime`,
  ]);
  assert.match(v49.rt, new RegExp(`^ContainerName=${n}-runtime$`, "m"), "the name Network=container: refers to");

  // 4.4 - 4.5: no Pull= and no optional device yet
  const v44 = quadlets("4.4.1");
  for (const [old, mid] of [[v44.rt, v49.rt], [v44.ex, v49.ex]]) {
    assert.doesNotMatch(old, /^Pull=/m);
    assert.match(old, /^AddDevice=\/dev\/kvm$/m, "required: the apply refuses a host without it (kvm-missing)");
    const pull = /^Pull=(.*)$/m.exec(mid)![1];
    assert.equal(
      old,
      mid.replace(/^Pull=.*$/m, `PodmanArgs=--pull=${pull}`).replace("AddDevice=-/dev/kvm", "AddDevice=/dev/kvm"),
    );
  }
  assert.match(v44.ex, /^PodmanArgs=--group-add 993$/m, "the kvm group by PodmanArgs, which every quadlet has");
  assert.deepEqual(quadlets("4.3.1"), v44, "below quadlet (refused by the apply): the oldest form, never thrown");
});
