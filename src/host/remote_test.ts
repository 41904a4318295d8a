import assert from "node:assert/strict";
import { APPLY_SH, INSPECT_SH, LIB_SH } from "./script_text.ts";
import type { InstanceParams } from "./instance_params.ts";
import { seedParams } from "../../test/fixtures.ts";
import { renderInstance } from "./render.ts";
import { factsWire, type HostFacts } from "./host_facts.ts";
import {
  applyScript,
  inspectScript,
  parseApplyOutput,
  parseInspectOutput,
  parseRemoveOutput,
  parseUnitsOutput,
  podmanTooOld,
  removeScript,
  sha256,
  shellCommand,
  shQuote,
  STAGE_SCRIPT_TEXT,
  unitsScript,
} from "./remote.ts";
import { MIN_PODMAN } from "./quadlet_dialect.ts";
import { Buffer } from "node:buffer";
import { definitions, recorder, records, runShell, SHELLS, withValues } from "./script_harness.ts";

const params: InstanceParams = { ...seedParams, runtime: { kvm: true, devices: ["/dev/ttyUSB0:/dev/ttyS1"] } };
const TOKEN = "eyJhbGciOiJSUzI1NiJ9.very-secret-token";
const rendered = renderInstance({
  namespace: "jumpstarter",
  name: "pool-x7k2p",
  uid: "0b7e6c1a-5f7d-4a8e-9c39-2f1d7e0a6b11",
  setName: "pool",
  params,
  drivers: [{ name: "qemu", type: "jumpstarter_driver_qemu.driver.Qemu" }],
  exitOnLeaseEnd: true,
  endpoint: "grpc.example.com:443",
  token: TOKEN,
  caBundle: "",
});

/** The script parses under every shell a host may run it with. */
async function assertParses(script: string) {
  for (const shell of SHELLS) {
    const out = await runShell(shell, script, ["-n"]);
    assert.equal(out.code, 0, `${shell}: ${out.stderr}`);
  }
}

/** The header's `NAME='value'` assignments of a script, by name, as a shell reads them. */
async function headerValues(script: string): Promise<Record<string, string>> {
  const header = script.slice(0, script.indexOf(LIB_SH));
  const names = [...header.matchAll(/^([A-Z][A-Z0-9_]*)='/gm)].map((m) => m[1]);
  const out = await runShell(
    "dash",
    `${header}\nfor k in ${names.join(" ")}; do
  eval "v=\\$$k"
  printf '%s\\0%s\\0' "$k" "$v"
done\n`,
  );
  const parts = out.stdout.split("\0");
  const values: Record<string, string> = {};
  for (let i = 0; i + 1 < parts.length; i += 2) values[parts[i]] = parts[i + 1];
  return values;
}

Deno.test("shellCommand: root runs sh, others go through passwordless sudo", () => {
  assert.equal(shellCommand("root"), "sh -s");
  assert.equal(shellCommand("lab"), "sudo -n sh -s");
});

Deno.test("shQuote survives a round trip through sh", async () => {
  for (const s of ["plain", "it's", '$(id) `id` "q" \\ %n', "a\nb", "'''", ""]) {
    const out = await new Deno.Command("dash", { args: ["-c", `printf '%s' ${shQuote(s)}`] }).output();
    assert.equal(new TextDecoder().decode(out.stdout), s);
  }
});

Deno.test("applyScript: scripts/apply.sh as it is after a header of values, valid sh, secrets only as base64", async () => {
  const s = applyScript(rendered, { kvmRequired: true });
  await assertParses(s);
  assert.ok(!s.includes(TOKEN), "the token never appears in clear, so a traced shell or log shows no secret");
  const header = s.slice(0, s.indexOf(LIB_SH));
  assert.equal(s, header + LIB_SH + APPLY_SH, "no value is spliced into the steps");
  assert.equal(header.replace(/^[A-Z][A-Z0-9_]*='[^']*'\n/gm, ""), "# pool-x7k2p: apply\n", "only assignments");
  const v = await headerValues(s);
  assert.equal(v.UID_, rendered.uid);
  assert.equal(v.RTQ, "/etc/containers/systemd/pool-x7k2p-runtime.container");
  assert.equal(v.DEVICES, "/dev/ttyUSB0");
  assert.equal(v.KVM_REQUIRED, "1");
  assert.equal(v.EXPORTER_UID, "65532");
  assert.equal(v.OWNER_PREFIX, "# qemu-ssh.jumpstarter.dev/owner: ");
  assert.equal((await headerValues(applyScript(rendered, { kvmRequired: false }))).KVM_REQUIRED, "0");
  assert.equal(v.KEEP_EXITED, "0", "exited exporters are restarted by default");
  assert.equal((await headerValues(applyScript(rendered, { kvmRequired: true, keepExited: true }))).KEEP_EXITED, "1");
  assert.doesNotMatch(s, /systemctl enable/, "generated units cannot be enabled; [Install] does it");
});

const dirOf = (p: string) => p.slice(0, p.lastIndexOf("/"));

Deno.test("apply's file steps, under dash and bash: every path ownership-checked, directories made, each file put", async () => {
  const steps = `${recorder(["check_owner", "link", "mkdir", "chmod", "chown"])}put() { rec put "$@"; changed=1; }
each_file check_paths
each_file make_dirs
rt_changed=0 ex_changed=0 cfg_changed=0
each_file write_file
rec changed "$rt_changed$ex_changed$cfg_changed"
`;
  const expected = [
    ...rendered.files.flatMap((f) => [f.path, ...f.links]).map((p) => ["check_owner", p, rendered.uid]),
    ...rendered.files.flatMap((f) => [
      ...[f.path, ...f.links].flatMap((
        p,
      ) => [["mkdir", "-p", dirOf(p)], ...f.secret ? [["chmod", "0700", dirOf(p)]] : []]),
      ...f.owner !== 0 ? [["chown", `${f.owner}:${f.owner}`, dirOf(f.path)]] : [],
    ]),
    ...rendered.files.flatMap((f) => [
      [
        "put",
        f.path,
        f.mode.toString(8),
        String(f.owner),
        sha256(f.content),
        Buffer.from(f.content).toString("base64"),
      ],
      ...f.links.map((l) => ["link", f.path, l]),
    ]),
    ["changed", "111"],
  ];
  assert.ok(expected.some((c) => c[0] === "chmod" && c[2] === "/etc/jumpstarter/exporters"), "the config is secret");
  assert.ok(expected.some((c) => c.join(" ") === "chown 65532:65532 /etc/jumpstarter/exporters/pool-x7k2p.d"));
  for (const shell of SHELLS) {
    const out = await runShell(shell, definitions(applyScript(rendered, { kvmRequired: true })) + steps);
    assert.equal(out.code, 0, `${shell}: ${out.stderr}`);
    assert.deepEqual(records(out.stdout), expected, shell);
  }
});

Deno.test("put and link, under dash and bash: a file is replaced only when its content or mode differs", async () => {
  for (const shell of SHELLS) {
    const dir = await Deno.makeTempDir();
    try {
      const f = `${dir}/a.yaml`, l = `${dir}/b.yaml`;
      const put = (content: string, mode: string) =>
        `put ${shQuote(f)} ${mode} 0 ${sha256(content)} ${Buffer.from(content).toString("base64")}\n`;
      const out = await runShell(
        shell,
        definitions(applyScript(rendered, { kvmRequired: true })) +
          `${put("one\n", "600")}${put("one\n", "600")}${put("one\n", "644")}${put("two\n", "644")}` +
          `link ${shQuote(f)} ${shQuote(l)}\nlink ${shQuote(f)} ${shQuote(l)}\nsay "done"\n`,
      );
      assert.equal(out.code, 0, `${shell}: ${out.stderr}`);
      assert.deepEqual(parseApplyOutput(out.stdout, out.stderr, out.code).changed, [f, f, f, l], shell);
      assert.equal(await Deno.readTextFile(l), "two\n");
      assert.equal((await Deno.stat(f)).mode! & 0o777, 0o644);
      assert.deepEqual([...Deno.readDirSync(dir)].map((e) => e.name).sort(), ["a.yaml", "b.yaml"], "no temp file left");
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  }
});

Deno.test("apply's stage-script step, under dash and bash: the host's staging script is written once, under the lock, and reported as no change", async () => {
  const s = applyScript(rendered, { kvmRequired: true });
  const v = await headerValues(s);
  assert.equal(v.STAGE_SCRIPT, "/var/lib/qemu-ssh.jumpstarter.dev/stage-launcher.sh");
  assert.equal(Buffer.from(v.STAGE_SH, "base64").toString("utf8"), STAGE_SCRIPT_TEXT);
  assert.equal(v.STAGE_HASH, sha256(STAGE_SCRIPT_TEXT));
  const at = (step: string) => APPLY_SH.indexOf(`\nstep=${step}\n`);
  assert.ok(at("lock") < at("stage-script") && at("stage-script") < at("start"), "under the lock, before any start");
  const step = APPLY_SH.slice(at("stage-script"), at("daemon-reload"));
  for (const shell of SHELLS) {
    const dir = await Deno.makeTempDir();
    try {
      const f = `${dir}/state/stage-launcher.sh`;
      const script = withValues(definitions(s), LIB_SH, { STAGE_SCRIPT: f }) + step + `say "done"\n`;
      for (const round of ["writes", "finds it written"]) {
        const out = await runShell(shell, script);
        assert.equal(out.code, 0, `${shell}: ${out.stderr}`);
        assert.deepEqual(parseApplyOutput(out.stdout, out.stderr, out.code).changed, [], `${shell} ${round}`);
        assert.equal(await Deno.readTextFile(f), STAGE_SCRIPT_TEXT);
        assert.equal((await Deno.stat(f)).mode! & 0o777, 0o755);
        assert.deepEqual([...Deno.readDirSync(`${dir}/state`)].map((e) => e.name), ["stage-launcher.sh"]);
      }
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  }
});

Deno.test("apply's start step, under dash and bash: units as they are now, not as the first look saw them", async () => {
  const s = applyScript(rendered, { kvmRequired: true });
  const at = (step: string) => APPLY_SH.indexOf(`\nstep=${step}\n`);
  const steps = APPLY_SH.slice(at("start"), at("report"));
  for (const shell of SHELLS) {
    const dir = await Deno.makeTempDir();
    try {
      // The script's first look saw both units down; since then a start queued before this apply (a restart's second
      // half) brought them up: every later look says active. podman and the starts are recorded.
      const fakes = `${recorder(["podman"])}
systemctl() {
  case "$1" in
  show)
    if [ -e ${shQuote(`${dir}/looked`)} ]; then state=active; else state=inactive; : >${shQuote(`${dir}/looked`)}; fi
    printf 'LoadState=loaded\nActiveState=%s\n\nLoadState=loaded\nActiveState=%s\n' "$state" "$state" ;;
  list-jobs) ;;
  *) rec systemctl "$@" ;;
  esac
}
fresh=0 restart= ex_exited=0 ex_started=0 rt_def= ex_def=
look
`;
      const script = withValues(definitions(s), LIB_SH, { RUN_DIR: dir }) + fakes + steps + `say "done"\n`;
      const out = await runShell(shell, script);
      assert.equal(out.code, 0, `${shell}: ${out.stderr}`);
      assert.deepEqual(records(out.stdout), [], `${shell}: nothing removed, nothing started`);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  }
});

Deno.test("the restart records, under dash and bash: systemctl show's lines parsed, a unit runs what it was started with", async () => {
  const rt = rendered.units.runtime;
  for (const shell of SHELLS) {
    const dir = await Deno.makeTempDir();
    try {
      const frag = `${dir}/u.service`;
      await Deno.writeTextFile(frag, "[Service]\nExecStart=/bin/one\n");
      // a fake systemctl: `show` prints, for each unit asked, what a running unit loaded from frag has
      const fake = `systemctl() { printf '%s\\n' LoadState=loaded ActiveState=active SubState=running NRestarts=2 \\
FragmentPath=${frag} NeedDaemonReload=no '' LoadState=not-found ActiveState=inactive; }\n`;
      const out = await runShell(
        shell,
        withValues(definitions(applyScript(rendered, { kvmRequired: true })), LIB_SH, { RUN_DIR: dir }) + fake +
          `look; loaded_defs
unit "$RT"; say state "$RT" "$active" "$sub" "$restarts"
unit "$EX"; say state "$EX" "$active" "$sub" "$restarts"
adopt "$RT"
if outdated "$RT"; then say restart-pending "$RT"; fi
printf '[Service]\\nExecStart=/bin/two\\n' >${shQuote(frag)}
if outdated "$RT"; then say restart-pending "$RT"; fi
look; loaded_defs
if outdated "$RT"; then say restarted "$RT"; fi
say "done"
`,
      );
      assert.equal(out.code, 0, `${shell}: ${out.stderr}`);
      const report = parseApplyOutput(out.stdout, out.stderr, out.code);
      assert.deepEqual(report.states, {
        [rt]: { active: "active", sub: "running", restarts: 2 },
        [rendered.units.exporter]: { active: "inactive", sub: undefined, restarts: 0 },
      }, `${shell}: each unit's block read apart`);
      assert.deepEqual(
        report.pending,
        [],
        `${shell}: a unit without a record is adopted; a definition not looked at yet owes nothing`,
      );
      assert.deepEqual(report.restarted, [rt], `${shell}: a new definition loaded owes a restart`);
      assert.equal(await Deno.readTextFile(`${dir}/${rt}.started`), `${sha256("[Service]\nExecStart=/bin/one\n")}\n`);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  }
});

Deno.test("make_volume, under dash and bash: labelled with the owner, the controller when there is one", async () => {
  const run = async (shell: string, controller: string) => {
    const s = applyScript({ ...rendered, controller }, { kvmRequired: true });
    // podman's output goes to /dev/null there: the fake records on fd 3
    const fake = `${recorder([])}podman() { rec podman "$@" >&3; }\nexec 3>&1\n`;
    const out = await runShell(shell, `${definitions(s)}${fake}make_volume v --opt o=uid=1,gid=1\n`);
    assert.equal(out.code, 0, `${shell}: ${out.stderr}`);
    assert.match(out.stdout, /\0qsp volume-created v\n$/);
    return records(out.stdout);
  };
  const labels = [
    "--label",
    "jumpstarter.dev/exporter=pool-x7k2p",
    "--label",
    `qemu-ssh.jumpstarter.dev/uid=${rendered.uid}`,
    "--label",
    "jumpstarter.dev/namespace=jumpstarter",
  ];
  for (const shell of SHELLS) {
    assert.deepEqual(await run(shell, ""), [["podman", "volume", "create", ...labels, "--opt", "o=uid=1,gid=1", "v"]]);
    assert.deepEqual(await run(shell, "ctl-1"), [[
      "podman",
      "volume",
      "create",
      ...labels,
      "--label",
      "qemu-ssh.jumpstarter.dev/controller=ctl-1",
      "--opt",
      "o=uid=1,gid=1",
      "v",
    ]]);
  }
});

/** A fake systemctl that knows no unit. */
const NO_UNITS = `systemctl() { if [ "$1" = show ]; then echo LoadState=not-found; fi; }`;

/**
 * The remove script run in a temporary root: its paths moved there, systemctl a fake (by default one that knows no
 * unit), podman a fake whose volumes are files (`vol-NAME` holding its uid label; inspect prints the ones there, exit
 * 125 if one is not, as podman does).
 */
async function removeInRoot(
  shell: string,
  dir: string,
  uid?: string,
  wait = "60",
  { name = "pool-x7k2p", systemctl = NO_UNITS } = {},
) {
  const s = removeScript(name, uid === undefined ? {} : { uid });
  const v = await headerValues(s);
  const moved = (p: string) => `${dir}${p}`;
  const fakes = `${systemctl}
vols=${shQuote(dir)}
podman() {
  case "$1 $2" in
  "container exists") return 1 ;;
  "volume inspect")
    shift 4
    rc=0
    for v in "$@"; do
      if [ -e "$vols/vol-$v" ]; then echo "$v $(cat "$vols/vol-$v")"; else rc=125; fi
    done
    return $rc ;;
  "volume rm")
    shift 3
    for v in "$@"; do rm "$vols/vol-$v"; done ;;
  esac
}
`;
  const script = withValues(s, LIB_SH, {
    RUN_DIR: dir,
    HOST_LOCK: `${dir}/lock`,
    NAME_LOCK: moved(v.NAME_LOCK),
    LOCK_WAIT_SECONDS: wait,
    FILES: v.FILES.split("\n").map(moved).join("\n"),
    MOUNT_DIR: moved(v.MOUNT_DIR),
    IMG: moved(v.IMG),
    STARTED: v.STARTED.split(" ").map(moved).join(" "),
    PENDING: v.PENDING && moved(v.PENDING),
  }).replace(LIB_SH, LIB_SH + fakes);
  const out = await runShell(shell, script);
  return { v, report: parseRemoveOutput(out.stdout, out.stderr, out.code), out };
}

Deno.test("removeScript in a temporary root, under dash and bash: ours goes, temp files too, a second run removes nothing", async () => {
  for (const shell of SHELLS) {
    const dir = await Deno.makeTempDir();
    try {
      const v = await headerValues(removeScript("pool-x7k2p", { uid: "u-1" }));
      const owner = (uid: string) => `# managed\n# qemu-ssh.jumpstarter.dev/owner: namespace=ns set=pool uid=${uid}\n`;
      const files = v.FILES.split("\n").map((p) => `${dir}${p}`);
      for (const f of [...files, `${dir}${v.IMG}`, `${dir}${dirOf(v.IMG)}/.pool-x7k2p.img.qsp-tmp.ab12`]) {
        await Deno.mkdir(dirOf(f), { recursive: true });
        await Deno.writeTextFile(f, owner("u-1"));
      }
      const tempFile = `${dirOf(files[2])}/.pool-x7k2p.yaml.qsp-tmp.XyZ123`;
      await Deno.writeTextFile(tempFile, "half written");
      await Deno.mkdir(`${dir}${dirOf(v.STARTED.split(" ")[0])}`, { recursive: true });
      await Deno.writeTextFile(`${dir}${v.STARTED.split(" ")[0]}`, "abc\n");
      await Deno.writeTextFile(`${dir}/vol-${v.VOLUME}`, "u-1\n");
      await Deno.writeTextFile(`${dir}/vol-${v.DISK}`, "u-2\n");

      // another uid's files are refused before anything goes
      const other = await removeInRoot(shell, dir, "u-9");
      assert.deepEqual(other.report.errors.map((e) => e.code), files.map(() => "owner-conflict"), shell);
      assert.ok(await Deno.stat(files[0]));

      const { report, out } = await removeInRoot(shell, dir, "u-1");
      assert.ok(report.ok, `${shell}: ${JSON.stringify(report.errors)} ${out.stderr}`);
      assert.deepEqual(report.removed, [
        ...files.map((name) => ({ kind: "file", name })),
        { kind: "file", name: tempFile },
        { kind: "dir", name: `${dir}${v.MOUNT_DIR}` },
        { kind: "file", name: `${dir}${dirOf(v.IMG)}/.pool-x7k2p.img.qsp-tmp.ab12` },
        { kind: "volume", name: v.VOLUME },
      ], shell);
      assert.ok(report.reloaded, "a quadlet went");
      // the disk volume is another uid's: it and its image stay
      assert.ok(await Deno.stat(`${dir}${v.IMG}`));
      await assert.rejects(Deno.stat(`${dir}${v.STARTED.split(" ")[0]}`), Deno.errors.NotFound);

      const again = await removeInRoot(shell, dir, "u-1");
      assert.deepEqual([again.report.ok, again.report.removed, again.report.reloaded], [true, [], false], shell);
      assert.match(again.out.stdout, /^qsp removed nothing$/m);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  }
});

Deno.test("removes at once, under dash and bash: one whose units stop later still shares the other's daemon-reload", async () => {
  for (const shell of SHELLS) {
    const dir = await Deno.makeTempDir();
    try {
      // both instances' units run; pool-slow's take 0.6 s to stop, long after pool-fast's; each reload is a line here
      const systemctl = `systemctl() {
  case "$1" in
  show) for u in "$@"; do case "$u" in *.service) printf 'LoadState=loaded\nActiveState=active\n\n' ;; esac; done ;;
  stop) case "$*" in *--no-block*) ;; *pool-slow*) sleep 0.6 ;; esac ;;
  daemon-reload) echo reload >>${shQuote(`${dir}/reloads`)} ;;
  esac
}`;
      const names = ["pool-fast", "pool-slow"];
      for (const name of names) {
        const v = await headerValues(removeScript(name));
        const quadlet = `${dir}${v.FILES.split("\n")[0]}`;
        await Deno.mkdir(dirOf(quadlet), { recursive: true });
        await Deno.mkdir(`${dir}${dirOf(v.NAME_LOCK)}`, { recursive: true });
        await Deno.writeTextFile(
          quadlet,
          `# managed\n# qemu-ssh.jumpstarter.dev/owner: namespace=ns set=pool uid=${name}\n`,
        );
      }
      const runs = await Promise.all(names.map((name) => removeInRoot(shell, dir, name, "60", { name, systemctl })));
      for (const { report, out } of runs) {
        assert.ok(report.ok, `${shell}: ${JSON.stringify(report.errors)} ${out.stderr}`);
      }
      assert.equal(runs.filter((r) => r.report.reloaded).length, 1, `${shell}: one of them reloaded, for both`);
      assert.equal(await Deno.readTextFile(`${dir}/reloads`), "reload\n", shell);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  }
});

Deno.test("inspectScript: scripts/inspect.sh after the constants, valid sh", async () => {
  const s = inspectScript();
  await assertParses(s);
  assert.ok(s.startsWith("# inspect\n") && s.endsWith(LIB_SH + INSPECT_SH));
});

Deno.test("unitsScript: the same inspect.sh asked for the units only, valid sh", async () => {
  const s = unitsScript();
  await assertParses(s);
  assert.ok(s.startsWith("# units\n") && s.includes("SCOPE='units'") && s.endsWith(LIB_SH + INSPECT_SH));
});

Deno.test("unitsScript, under dash and bash: the look waits while a start or restart is queued, at most its ticks", async () => {
  for (const shell of SHELLS) {
    const dir = await Deno.makeTempDir();
    try {
      // a FAKE systemctl (a shell function, ahead of PATH): list-jobs shows the exporter's job for its first `queued`
      // calls, each counted; sleep is counted, not slept
      const fake = (job: string, queued: number) =>
        `systemctl() {
  case "$1" in
  list-jobs)
    n=$(cat ${dir}/jobs 2>/dev/null || echo 0); echo $((n + 1)) >${dir}/jobs
    if [ "$n" -lt ${queued} ]; then echo "7 a-exporter.service ${job} waiting"; fi ;;
  list-units) echo "a-exporter.service loaded inactive dead Jumpstarter exporter" ;;
  esac
}
sleep() { echo x >>${dir}/sleeps; }
`;
      const look = async (waitMs: number, job: string, queued: number) => {
        await Deno.remove(`${dir}/jobs`).catch(() => {});
        await Deno.remove(`${dir}/sleeps`).catch(() => {});
        const out = await runShell(shell, fake(job, queued) + unitsScript(waitMs));
        assert.equal(out.code, 0, `${shell}: ${out.stderr}`);
        const sleeps = (await Deno.readTextFile(`${dir}/sleeps`).catch(() => "")).split("\n").length - 1;
        return { sleeps, job: parseUnitsOutput(out.stdout, out.stderr, out.code).units["a-exporter.service"]?.job };
      };
      assert.deepEqual(await look(1_000, "start", 3), { sleeps: 3, job: undefined }, `${shell}: until the start ended`);
      assert.deepEqual(await look(1_000, "restart", 99), { sleeps: 10, job: "restart" }, `${shell}: a second at most`);
      assert.deepEqual(await look(1_000, "stop", 99), { sleeps: 0, job: "stop" }, `${shell}: a stop is not waited for`);
      assert.deepEqual(await look(0, "start", 99), { sleeps: 0, job: "start" }, `${shell}: no wait asked`);
      assert.deepEqual(await look(150, "start", 99), { sleeps: 2, job: "start" }, `${shell}: tenths rounded up`);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  }
});

Deno.test("parseUnitsOutput: each unit with its queued job; a units look that did not finish is an error", () => {
  const out = `qsp unit a-runtime.service loaded active running
qsp unit a-exporter.service loaded inactive dead
qsp job a-exporter.service start
qsp job z-runtime.service stop
qsp done
`;
  assert.deepEqual(parseUnitsOutput(out, "", 0), {
    ok: true,
    units: {
      "a-runtime.service": { load: "loaded", active: "active", sub: "running" },
      "a-exporter.service": { load: "loaded", active: "inactive", sub: "dead", job: "start" },
    },
    errors: [],
  });
  const cut = parseUnitsOutput("qsp unit a-runtime.service loaded active running\n", "", 255);
  assert.deepEqual([cut.ok, cut.errors[0]?.code], [false, "incomplete"]);
});

Deno.test("coalesced daemon-reload, under dash and bash: the first script under the exclusive lock reloads for all that wrote", async () => {
  for (const shell of SHELLS) {
    const dir = await Deno.makeTempDir();
    try {
      // each call is one script's turn: its mark (after its writes), then its reload; systemctl records the reloads
      const s = withValues(removeScript("pool-x7k2p"), LIB_SH, {
        RUN_DIR: dir,
        HOST_LOCK: `${dir}/lock`,
        NAME_LOCK: `${dir}/pool-x7k2p.lock`,
      });
      const turn = async (steps: string) => {
        const out = await runShell(shell, `${definitions(s)}${recorder(["systemctl"])}${steps}\n`);
        assert.equal(out.code, 0, `${shell}: ${out.stderr}`);
        return out.stdout;
      };
      // A and B wrote; B's reload covers A's writes as well as its own
      await turn("lock_host -s; reload_owed");
      const b = await turn("lock_host -s; reload_owed; lock_host -x; reload_systemd");
      assert.deepEqual(records(b), [["systemctl", "daemon-reload"]], shell);
      assert.match(b, /qsp reloaded\n$/);
      const a = await turn("lock_host -x; reload_systemd");
      assert.deepEqual([records(a), a], [[], ""], `${shell}: A's writes were covered`);
      // C wrote after that reload: it reloads again
      const c = await turn("lock_host -s; reload_owed; lock_host -x; reload_systemd");
      assert.deepEqual(records(c), [["systemctl", "daemon-reload"]], shell);
      await assert.rejects(Deno.stat(`${dir}/reload-owed`), Deno.errors.NotFound);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  }
});

Deno.test("the host lock, under dash and bash: a script refuses with host-busy while another holds it", async () => {
  for (const shell of SHELLS) {
    const dir = await Deno.makeTempDir();
    const holder = new Deno.Command("flock", {
      args: [`${dir}/lock`, "sh", "-c", "echo held; read -r _"],
      stdin: "piped",
      stdout: "piped",
    }).spawn();
    try {
      const reader = holder.stdout.getReader();
      assert.equal(new TextDecoder().decode((await reader.read()).value), "held\n");
      const { report, out } = await removeInRoot(shell, dir, undefined, "0");
      assert.equal(out.code, 2, shell);
      assert.deepEqual(report.errors.map((e) => e.code), ["host-busy"], shell);
      assert.match(report.errors[0].message, new RegExp(`held ${dir}/lock for over 0s`));
      reader.releaseLock();
    } finally {
      await holder.stdin.close();
      await holder.stdout.cancel();
      await holder.status;
      await Deno.remove(dir, { recursive: true });
    }
  }
});

Deno.test("parseApplyOutput: a first apply", () => {
  const out = `Warning: some tool noise
qsp changed /etc/jumpstarter/exporters/p.d/p.yaml
qsp changed /etc/jumpstarter/exporters/p.yaml
qsp changed /etc/containers/systemd/p-runtime.container
qsp changed /etc/containers/systemd/p-exporter.container
qsp volume-created jumpstarter-p-shared
qsp reloaded
qsp started p-runtime.service
qsp started p-exporter.service
qsp state p-runtime.service active running 0
qsp state p-exporter.service activating auto-restart 3
qsp journal standin-exporter: config error: open /etc/x.yaml: permission denied
qsp journal token eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl leaked
qsp done
`;
  assert.deepEqual(parseApplyOutput(out, "", 0), {
    ok: true,
    changed: [
      "/etc/jumpstarter/exporters/p.d/p.yaml",
      "/etc/jumpstarter/exporters/p.yaml",
      "/etc/containers/systemd/p-runtime.container",
      "/etc/containers/systemd/p-exporter.container",
    ],
    volumeCreated: true,
    reloaded: true,
    restarted: [],
    hupped: [],
    started: ["p-runtime.service", "p-exporter.service"],
    exited: [],
    pending: [],
    states: {
      "p-runtime.service": { active: "active", sub: "running", restarts: 0 },
      "p-exporter.service": { active: "activating", sub: "auto-restart", restarts: 3 },
    },
    journal: [
      "standin-exporter: config error: open /etc/x.yaml: permission denied",
      "token <redacted> leaked",
    ],
    errors: [],
  });
});

Deno.test("parseApplyOutput: token rotation, refusals, failed steps and dropped connections", () => {
  const exited = parseApplyOutput(
    "qsp exited p-exporter.service\nqsp state p-exporter.service inactive dead 0\nqsp done\n",
    "",
    0,
  );
  assert.deepEqual([exited.ok, exited.exited, exited.started], [true, ["p-exporter.service"], []]);
  const deferred = parseApplyOutput(
    "qsp restart-pending p-runtime.service\nqsp restart-pending p-exporter.service\nqsp done\n",
    "",
    0,
  );
  assert.deepEqual(deferred.pending, ["p-runtime.service", "p-exporter.service"]);

  const hup = parseApplyOutput("qsp changed /x.yaml\nqsp hup p-exporter.service\nqsp done\n", "", 0);
  assert.deepEqual([hup.ok, hup.hupped, hup.restarted, hup.reloaded], [true, ["p-exporter.service"], [], false]);

  const refused = parseApplyOutput(
    "qsp error owner-conflict /etc/containers/systemd/p-runtime.container belongs to exporter uid=aaa, not uid=bbb\n" +
      "qsp error kvm-missing /dev/kvm is not present on this host\nqsp done\n",
    "",
    2,
  );
  assert.equal(refused.ok, false);
  assert.deepEqual(refused.errors, [
    {
      code: "owner-conflict",
      message: "/etc/containers/systemd/p-runtime.container belongs to exporter uid=aaa, not uid=bbb",
    },
    { code: "kvm-missing", message: "/dev/kvm is not present on this host" },
  ]);

  const failed = parseApplyOutput(
    "qsp changed /x\nqsp error step-failed daemon-reload (exit 1)\n",
    "Failed to reload daemon: Access denied\n",
    1,
  );
  assert.deepEqual(failed.errors, [
    { code: "step-failed", message: "daemon-reload (exit 1): Failed to reload daemon: Access denied" },
  ]);
  assert.deepEqual(failed.changed, ["/x"]);

  const cut = parseApplyOutput("qsp changed /x\n", "", 255);
  assert.deepEqual(cut.errors, [{ code: "incomplete", message: "the script did not finish (exit 255)" }]);

  const sudo = parseApplyOutput("", "sudo: a password is required\n", 1);
  assert.deepEqual(sudo.errors, [
    { code: "incomplete", message: "the script did not finish (exit 1): sudo: a password is required" },
  ]);

  const oddExit = parseApplyOutput("qsp done\n", "", 3);
  assert.deepEqual(oddExit.errors, [{ code: "exit", message: "exit 3" }]);
});

Deno.test("parseRemoveOutput", () => {
  const r = parseRemoveOutput(
    `qsp stopped p-exporter.service
qsp stopped p-runtime.service
qsp removed container p-runtime
qsp removed file /etc/containers/systemd/p-runtime.container
qsp removed volume jumpstarter-p-shared
qsp reloaded
qsp done
`,
    "",
    0,
  );
  assert.deepEqual(r, {
    ok: true,
    stopped: ["p-exporter.service", "p-runtime.service"],
    removed: [
      { kind: "container", name: "p-runtime" },
      { kind: "file", name: "/etc/containers/systemd/p-runtime.container" },
      { kind: "volume", name: "jumpstarter-p-shared" },
    ],
    reloaded: true,
    errors: [],
  });
  const again = parseRemoveOutput("qsp removed nothing\nqsp done\n", "", 0);
  assert.deepEqual([again.ok, again.removed, again.reloaded], [true, [], false]);
});

Deno.test("parseInspectOutput: host facts, instances, half-deployed leftovers", () => {
  const owner = (ns: string, n: string, uid: string) => `namespace=${ns} set=pool exporter=${n} uid=${uid}`;
  const out = `qsp facts podman=5.4.2 kvm=660:993
qsp systemd 257
qsp generator /usr/lib/systemd/system-generators/podman-system-generator
qsp disk /etc 1048576
qsp disk /var/lib/containers 2097152
qsp file runtime a /etc/containers/systemd/a-runtime.container ${owner("ns1", "a", "u-a")}
qsp file exporter a /etc/containers/systemd/a-exporter.container ${owner("ns1", "a", "u-a")}
qsp file config a /etc/jumpstarter/exporters/a.yaml ${owner("ns1", "a", "u-a")}
qsp file config b /etc/jumpstarter/exporters/b.yaml ${owner("ns2", "b", "u-b")}
qsp file runtime c /etc/containers/systemd/c-runtime.container ${owner("ns1", "c", "u-c")}
qsp file exporter c /etc/containers/systemd/c-exporter.container ${owner("ns2", "c", "u-c2")}
qsp mode /etc/containers/systemd/a-runtime.container 644:0:0
qsp sha256 /etc/containers/systemd/a-runtime.container ${"1".repeat(64)}
qsp unit a-runtime.service loaded active running
qsp unit a-exporter.service loaded failed failed
qsp unit node-exporter.service loaded active running
qsp job a-exporter.service start
qsp job z-runtime.service stop
qsp container a a-runtime running u-a
qsp container d d-exporter exited u-d
qsp volume jumpstarter-a-shared
qsp volume jumpstarter-e-shared
qsp volume jumpstarter-a-disk u-a ns1
qsp volume jumpstarter-f-disk u-f ns3
qsp done
`;
  const h = parseInspectOutput(out, "", 0);
  assert.equal(h.ok, true);
  assert.deepEqual(h.facts, { podman: "5.4.2", kvm: { mode: 0o660, gid: 993 } });
  assert.equal(h.systemdVersion, 257);
  assert.equal(h.generator, "/usr/lib/systemd/system-generators/podman-system-generator");
  assert.deepEqual(h.diskFreeKiB, { "/etc": 1048576, "/var/lib/containers": 2097152 });
  assert.deepEqual(h.instances.map((i) => i.name), ["a", "b", "c", "d", "e", "f"]);
  const [a, b, c, d, e, f] = h.instances;
  assert.deepEqual(a, {
    name: "a",
    namespace: "ns1",
    set: "pool",
    uid: "u-a",
    files: [
      {
        kind: "runtime",
        path: "/etc/containers/systemd/a-runtime.container",
        mode: "644:0:0",
        sha256: "1".repeat(64),
      },
      { kind: "exporter", path: "/etc/containers/systemd/a-exporter.container" },
      { kind: "config", path: "/etc/jumpstarter/exporters/a.yaml" },
    ],
    ownerMismatch: false,
    runtime: { load: "loaded", active: "active", sub: "running" },
    exporter: { load: "loaded", active: "failed", sub: "failed", job: "start" },
    containers: [{ name: "a-runtime", state: "running", uid: "u-a" }],
    volume: true,
    diskVolume: true,
  });
  assert.deepEqual([b.namespace, b.files.map((f) => f.kind), b.runtime, b.volume], [
    "ns2",
    ["config"],
    undefined,
    false,
  ]);
  assert.equal(c.ownerMismatch, true);
  assert.deepEqual([d.uid, d.files, d.containers[0].state], ["u-d", [], "exited"], "a container without files");
  assert.deepEqual([e.uid, e.files, e.volume], [undefined, [], true], "a volume without files");
  // a /disk volume left alone names its owner by its labels, so the sweep can judge it
  assert.deepEqual([f.uid, f.namespace, f.files, f.volume, f.diskVolume], ["u-f", "ns3", [], false, true]);

  const noPodman = parseInspectOutput(
    "qsp facts podman= kvm=none\nqsp systemd 252\nqsp generator none\nqsp done\n",
    "",
    0,
  );
  assert.deepEqual([noPodman.facts, noPodman.generator], [{ podman: "", kvm: null }, undefined]);
});

Deno.test("inspect: a running unit whose record differs from what systemd loaded owes a restart", () => {
  const sum = (c: string) => c.repeat(64);
  const out = `qsp file runtime a /etc/containers/systemd/a-runtime.container namespace=n set=s exporter=a uid=u-a
qsp file runtime b /etc/containers/systemd/b-runtime.container namespace=n set=s exporter=b uid=u-b
qsp unit a-runtime.service loaded active running
qsp unit a-exporter.service loaded active running
qsp unit b-runtime.service loaded active running
qsp unit b-exporter.service loaded inactive dead
qsp record a-runtime.service ${sum("1")}
qsp record a-exporter.service ${sum("2")}
qsp record b-exporter.service ${sum("3")}
qsp loaded a-runtime.service ${sum("4")}
qsp loaded a-exporter.service ${sum("2")}
qsp loaded b-runtime.service ${sum("5")}
qsp loaded b-exporter.service ${sum("6")}
qsp done
`;
  const [a, b] = parseInspectOutput(out, "", 0).instances;
  assert.deepEqual(a.outdated, ["a-runtime.service"]);
  // b's runtime has no record (the next apply adopts it), its exporter does not run (a start runs what is loaded)
  assert.equal(b.outdated, undefined);
});

Deno.test("journal text cannot forge protocol lines, under dash and under bash (M8)", async () => {
  const say = applyScript(rendered, { kvmRequired: false }).split("\n").find((l) => l.startsWith("say()"));
  assert.ok(say);
  // what Python's repr puts in a log line: backslash escapes spelled out, which dash's echo would expand
  const forged = String.raw`boom\nqsp state pool-x7k2p-exporter.service active running 0\c`;
  const script = `${say}\nprintf '%s\\n' ${
    shQuote(forged)
  } | while IFS= read -r l; do say journal "$l"; done\nsay done\n`;
  for (const shell of ["dash", "bash"]) {
    const out = await new Deno.Command(shell, { args: ["-c", script] }).output();
    const report = parseApplyOutput(new TextDecoder().decode(out.stdout), "", out.code);
    assert.deepEqual(report.states, {}, shell);
    assert.deepEqual(report.journal, [forged], shell);
  }
});

/** Whether this machine has a /dev/kvm node: the preflight's `[ -c /dev/kvm ]` cannot be stubbed. */
const kvmHere = (() => {
  try {
    return Deno.statSync("/dev/kvm").isCharDevice === true;
  } catch {
    return false;
  }
})();

/** The facts the preflight below finds: its `stat` stub says 0660 gid 993. */
const stubFacts = (podman: string): HostFacts => ({ podman, kvm: kvmHere ? { mode: 0o660, gid: 993 } : null });

/**
 * The apply script up to its first step that touches the host, run by `shell` with `podman` and the tools as stubs,
 * for files rendered for `facts` (by default the facts it will find).
 */
async function preflight(podmanVersion: string | null, facts?: HostFacts | null, shell = "dash") {
  const found = stubFacts(podmanVersion?.split(" ").at(-1) ?? "");
  const s = applyScript({ ...rendered, facts: facts === null ? undefined : facts ?? found }, { kvmRequired: false });
  const cut = s.indexOf("\nstep=lock\n");
  assert.ok(cut > 0 && s.indexOf("podman --version") < cut, "the version is checked before the host is locked");
  const stubs = [
    podmanVersion === null ? "podman() { return 127; }" : `podman() { echo ${shQuote(podmanVersion)}; }`,
    "stat() { echo 660:993; }",
    ...["systemctl", "base64", "sha256sum", "mktemp", "flock"].map((c) => `${c}() { :; }`),
  ].join("\n");
  // the stubs go after the prelude's PATH line: functions win over PATH either way
  const script = `${stubs}\n${s.slice(0, cut)}\nsay done\n`;
  const p = new Deno.Command(shell, { args: ["-s"], stdin: "piped", stdout: "piped", stderr: "piped" }).spawn();
  const w = p.stdin.getWriter();
  await w.write(new TextEncoder().encode(script));
  await w.close();
  const out = await p.output();
  const dec = new TextDecoder();
  return parseApplyOutput(dec.decode(out.stdout), dec.decode(out.stderr), out.code);
}

Deno.test("applyScript: the host's facts are printed, and files rendered for others refused, before any write", async () => {
  for (const shell of ["dash", "bash"]) {
    const same = await preflight("podman version 5.4.2", undefined, shell);
    assert.ok(same.ok, `${shell}: ${JSON.stringify(same.errors)}`);
    assert.deepEqual(same.facts, stubFacts("5.4.2"), shell);

    const cases: [string, HostFacts | null][] = [
      ["first contact", null],
      ["another podman", stubFacts("5.3.1")],
      ["another kvm group", { podman: "5.4.2", kvm: { mode: 0o660, gid: 36 } }],
      ["another kvm mode", { podman: "5.4.2", kvm: { mode: 0o666, gid: 993 } }],
      ["kvm present or not", { podman: "5.4.2", kvm: kvmHere ? null : { mode: 0o660, gid: 993 } }],
    ];
    for (const [what, facts] of cases) {
      const r = await preflight("podman version 5.4.2", facts, shell);
      assert.deepEqual(r.errors.map((e) => e.code), ["facts-changed"], `${shell}, ${what}`);
      assert.equal(
        r.errors[0].message,
        `this host is ${factsWire(stubFacts("5.4.2"))}; the files were rendered for ${factsWire(facts ?? undefined)}`,
      );
      assert.deepEqual(r.facts, stubFacts("5.4.2"), `${shell}, ${what}: the host's facts come back`);
    }
  }
});

Deno.test("applyScript: a Podman older than 4.4 (no quadlet) is refused (podman-too-old) before anything is written", async () => {
  assert.deepEqual(MIN_PODMAN, [4, 4]);
  const cases: [string, boolean | undefined][] = [
    ["podman version 3.4.4", true],
    ["podman version 4.3.1", true],
    ["podman version 4.3.1+ds1-8+deb12u1+b3", true],
    ["podman version 4.4.0-rc1", false],
    ["podman version 4.4.1", false],
    ["podman version 4.9.3", false],
    ["podman version 5.2.5", false],
    ["podman version 5.3.0-rc1", false],
    ["podman version 5.3.0", false],
    ["podman version 5.4.2", false],
    ["podman version 6.0.0", false],
    ["podman version 10.1.0", false],
    ["podman version dev", undefined],
    ["podman version 5", undefined],
  ];
  for (const [line, old] of cases) {
    const version = line.split(" ").at(-1)!;
    assert.equal(podmanTooOld(version), old, line);
    const report = await preflight(line);
    if (old) {
      assert.equal(report.ok, false, line);
      assert.deepEqual(report.errors.map((e) => e.code), ["podman-too-old"], line);
      assert.match(
        report.errors[0].message,
        new RegExp(`^podman ${version.replace(/[.+]/g, "\\$&")} is older than 4\\.4 and has no quadlet`),
      );
      assert.match(report.errors[0].message, /; upgrade podman to 4\.4 or later \(/);
      assert.deepEqual(report.changed, [], "nothing written");
    } else {
      // a version that is not a number is let through: the apply goes on to the ownership step
      assert.ok(report.ok, `${line}: ${JSON.stringify(report.errors)}`);
    }
  }
  const none = await preflight(null);
  assert.deepEqual(none.errors.map((e) => e.code), [], "a podman that prints nothing is not refused as too old");
});

Deno.test("parseApplyOutput: a podman-too-old refusal is an error with its code, not a failed step", () => {
  const r = parseApplyOutput(
    "qsp error podman-too-old podman 4.3.1 is older than 4.4 and has no quadlet ...; upgrade podman to 4.4 or later\nqsp done\n",
    "",
    2,
  );
  assert.equal(r.ok, false);
  assert.deepEqual(r.errors, [
    {
      code: "podman-too-old",
      message: "podman 4.3.1 is older than 4.4 and has no quadlet ...; upgrade podman to 4.4 or later",
    },
  ]);
});

Deno.test("applyScript: KVM required where only /dev/kvm's owner may open it is refused (kvm-denied), by dash and bash", async () => {
  const denied = { ...rendered, facts: { podman: "5.4.2", kvm: { mode: 0o600, gid: 0 } } };
  const s = applyScript(denied, { kvmRequired: true });
  assert.deepEqual([(await headerValues(s)).KVM_DENIED_MODE, (await headerValues(s)).KVM_GID], ["0600", "0"]);
  for (const kvm of [{ mode: 0o660, gid: 993 }, { mode: 0o666, gid: 0 }, null]) {
    const v = await headerValues(applyScript({ ...rendered, facts: { podman: "5.4.2", kvm } }, { kvmRequired: true }));
    assert.equal(v.KVM_DENIED_MODE, "", JSON.stringify(kvm));
  }
  // the devices step alone, with the node's owner as stat would name it
  const from = APPLY_SH.indexOf("\nstep=devices\n");
  const step = APPLY_SH.slice(from, APPLY_SH.indexOf("\nrefuse_if_errors\n", from));
  for (const shell of SHELLS) {
    for (const [kvmRequired, expected] of [[true, ["kvm-denied"]], [false, []]] as const) {
      const script = `${
        definitions(applyScript(denied, { kvmRequired }))
      }stat() { echo root:root; }\n${step}\nsay done\n`;
      const out = await runShell(shell, script);
      const report = parseApplyOutput(out.stdout, out.stderr, out.code);
      const codes = report.errors.map((e) => e.code);
      assert.ok(codes.includes("device-missing"), `${shell}: /dev/ttyUSB0 is missing here`);
      assert.deepEqual(codes.filter((c) => c !== "kvm-missing" && c !== "device-missing"), expected, shell);
      if (!kvmRequired) continue;
      const message = report.errors.find((e) => e.code === "kvm-denied")!.message;
      assert.match(message, /^\/dev\/kvm is mode 0600 owned by root:root \(gid 0\): the exporter \(uid 65532/);
      assert.match(message, /make it 0660 root:kvm .*KERNEL=="kvm", GROUP="kvm", MODE="0660".* or 0666 as Fedora/);
    }
  }
});
