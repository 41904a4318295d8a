/**
 * The alternative: ansible-core (pip, in a venv under the project's cache) running bench/ansible/*.yml, which a
 * person would write with built-in modules, against the same hosts and the same rendered files. SSH pipelining on,
 * forks = hosts, OpenSSH ControlPersist (ansible's default), strict host key checking against the lab known_hosts.
 * Every playbook run gets its own control sockets, stopped afterwards, so each run pays for its own connections as a
 * run an hour later would. ssh/sftp/scp go through counting wrappers: each invocation is one round trip.
 */
import { join } from "node:path";
import { homedir } from "node:os";
import type { LabHost } from "../test/labhost/labhost.ts";
import { type Deployer, layout, type SshCounts } from "./deployer.ts";
import type { Placement } from "./fleet.ts";

const VENV = join(Deno.env.get("XDG_CACHE_HOME") ?? join(homedir(), ".cache"), "qemu-ssh-provisioner", "bench-venv");
const REQUIREMENT = "ansible-core>=2.19,<2.20";
const PLAYBOOKS = join(import.meta.dirname!, "ansible");

async function run(cmd: string, args: string[], opts: { env?: Record<string, string> } = {}) {
  const out = await new Deno.Command(cmd, { args, env: opts.env, stdin: "null", stdout: "piped", stderr: "piped" })
    .output();
  const text = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
  return { ok: out.success, code: out.code, text };
}

/** Creates the venv and installs ansible-core on first use; returns `ansible-playbook --version`'s first line. */
export async function ensureAnsible(): Promise<string> {
  const playbook = join(VENV, "bin", "ansible-playbook");
  if (!await Deno.stat(playbook).then(() => true, () => false)) {
    console.error(`[bench] installing ${REQUIREMENT} into ${VENV}`);
    for (
      const [cmd, args] of [["python3", ["-m", "venv", VENV]], [join(VENV, "bin", "pip"), [
        "install",
        "-q",
        REQUIREMENT,
      ]]] as const
    ) {
      const r = await run(cmd, [...args]);
      if (!r.ok) throw new Error(`${cmd} ${args.join(" ")} failed:\n${r.text}`);
    }
  }
  const v = await run(playbook, ["--version"]);
  if (!v.ok) throw new Error(`ansible-playbook --version failed:\n${v.text}`);
  return v.text.split("\n")[0].trim();
}

/** Per-host variables: the instances' layouts, flattened the way the playbooks loop over them. */
function inventory(p: Placement) {
  const hosts: Record<string, unknown> = {};
  for (const { host, instances } of p) {
    const ls = instances.map(layout);
    const dirs = new Map(ls.flatMap((l) => l.dirs).map((d) => [d.path, d]));
    hosts[host.name] = {
      ansible_host: host.address,
      qsp_dirs: [...dirs.values()],
      qsp_files: ls.flatMap((l) => l.files),
      qsp_links: ls.flatMap((l) => l.links),
      qsp_volumes: ls.map((l) => l.volume),
      qsp_volume_options: ls[0]?.volumeOptions ?? [],
      qsp_disks: ls.map((l) => ({ volume: l.diskVolume, command: l.diskCommand })),
      qsp_units: ls.flatMap((l) => l.units),
      qsp_remove: ls.flatMap((l) => l.remove),
    };
  }
  return { lab: { hosts } };
}

const WRAPPER = `#!/bin/sh
# counts one round trip per invocation (not the local -O control commands), then runs the real client
case " $* " in *" -O "*) ;; *) echo "\${0##*/}" >>"$QSP_BENCH_SSH_LOG" ;; esac
exec "/usr/bin/\${0##*/}" "$@"
`;

export class Ansible implements Deployer {
  readonly name = "ansible-core playbook";
  #runs = 0;

  private constructor(private readonly dir: string, private readonly hosts: LabHost[]) {}

  /** A working directory with ansible.cfg and the counting ssh wrappers, for a fleet on `hosts`. */
  static async create(dir: string, hosts: LabHost[]): Promise<Ansible> {
    await Deno.mkdir(join(dir, "bin"), { recursive: true });
    for (const tool of ["ssh", "sftp", "scp"]) {
      await Deno.writeTextFile(join(dir, "bin", tool), WRAPPER, { mode: 0o755 });
    }
    const [h] = hosts;
    const sshArgs = [
      "-C -o ControlMaster=auto -o ControlPersist=60s", // ansible's default ssh_args
      "-F /dev/null -o BatchMode=yes -o StrictHostKeyChecking=yes",
      `-o UserKnownHostsFile=${h.knownHostsPath} -o GlobalKnownHostsFile=/dev/null`,
    ].join(" ");
    await Deno.writeTextFile(
      join(dir, "ansible.cfg"),
      `[defaults]
host_key_checking = True
remote_user = ${h.user}
private_key_file = ${h.privateKeyPath}
interpreter_python = /usr/bin/python3
local_tmp = ${dir}/tmp
nocolor = True

[ssh_connection]
pipelining = True
ssh_args = ${sshArgs}
ssh_executable = ${dir}/bin/ssh
sftp_executable = ${dir}/bin/sftp
scp_executable = ${dir}/bin/scp
`,
    );
    return new Ansible(dir, hosts);
  }

  /** Runs one playbook; returns its SSH cost. */
  async playbook(name: "deploy" | "teardown" | "noop", p: Placement): Promise<SshCounts> {
    const n = ++this.#runs;
    const inv = join(this.dir, `inventory-${n}.json`);
    const cp = join(this.dir, `cp-${n}`);
    const count = join(this.dir, `ssh-${n}.log`);
    await Deno.writeTextFile(inv, JSON.stringify(inventory(p)));
    await Deno.mkdir(cp);
    await Deno.writeTextFile(count, "");
    const env = {
      ANSIBLE_CONFIG: join(this.dir, "ansible.cfg"),
      ANSIBLE_FORKS: String(p.length), // one per host
      ANSIBLE_HOME: join(this.dir, "home"),
      ANSIBLE_SSH_CONTROL_PATH_DIR: cp,
      QSP_BENCH_SSH_LOG: count,
    };
    try {
      const r = await run(join(VENV, "bin", "ansible-playbook"), ["-i", inv, join(PLAYBOOKS, `${name}.yml`)], { env });
      await Deno.writeTextFile(join(this.dir, `${name}-${n}.log`), r.text);
      if (!r.ok) throw new Error(`ansible-playbook ${name} failed (exit ${r.code}):\n${r.text.slice(-3000)}`);
      const lines = (await Deno.readTextFile(count)).split("\n").filter((l) => l);
      return { sshRoundTrips: lines.length };
    } finally {
      await this.stopMasters(cp);
    }
  }

  /** Ends the ControlPersist masters this run left, by their sockets. */
  private async stopMasters(cp: string): Promise<void> {
    for await (const e of Deno.readDir(cp)) {
      await run("/usr/bin/ssh", ["-o", `ControlPath=${join(cp, e.name)}`, "-O", "exit", this.hosts[0].address]);
    }
  }

  deploy(p: Placement): Promise<SshCounts> {
    return this.playbook("deploy", p);
  }

  teardown(p: Placement): Promise<SshCounts> {
    return this.playbook("teardown", p);
  }
}
