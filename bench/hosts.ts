/**
 * What the bench checks on the lab hosts between measurements (never timed): that a deployer left the right files and
 * running units, that a teardown left nothing, and when each instance's units became active.
 */
import { createHash } from "node:crypto";
import type { LabHost } from "../test/labhost/labhost.ts";
import { LabHosts } from "../src/host/lab.ts";
import { shQuote } from "../src/host/remote.ts";
import { SshPool, type SshTarget } from "../src/host/ssh.ts";
import { type Placement, sshTargetOf } from "./fleet.ts";

export class HostProbe {
  readonly #pool = new SshPool();
  readonly #lab = new LabHosts(this.#pool);
  readonly #targets = new Map<string, Promise<SshTarget>>();

  target(h: LabHost): Promise<SshTarget> {
    let t = this.#targets.get(h.address);
    if (!t) this.#targets.set(h.address, t = sshTargetOf(h));
    return t;
  }

  async #exec(h: LabHost, command: string): Promise<string> {
    const r = await this.#pool.exec(await this.target(h), command);
    if (r.code !== 0) throw new Error(`${h.name}: \`${command.slice(0, 80)}\` exit ${r.code}: ${r.stderr.trim()}`);
    return r.stdout;
  }

  /** Throws unless no host has a file, unit, container or volume of any instance (the inspect script's view). */
  async assertClean(hosts: LabHost[], after: string): Promise<void> {
    const left = await Promise.all(hosts.map(async (h) => {
      const seen = await this.#lab.inspect(await this.target(h));
      return seen.instances.map((i) => `${h.name}:${i.name}`);
    }));
    if (left.flat().length) throw new Error(`${after} left instances behind: ${left.flat().join(", ")}`);
  }

  /** Throws unless every rendered file is on its host byte for byte and both units of every instance are active. */
  async assertDeployed(placement: Placement, by: string): Promise<void> {
    await Promise.all(placement.map(async ({ host, instances }) => {
      const files = instances.flatMap((r) => r.files.flatMap((f) => [f, ...f.links.map((l) => ({ ...f, path: l }))]));
      const units = instances.flatMap((r) => [r.units.runtime, r.units.exporter]);
      const out = await this.#exec(
        host,
        `sha256sum ${files.map((f) => shQuote(f.path)).join(" ")}; systemctl is-active ${units.join(" ")} || true`,
      );
      const lines = out.trim().split("\n");
      const bad = files.filter((f, i) => lines[i]?.split(" ")[0] !== sha256(f.content)).map((f) => f.path);
      const inactive = units.filter((_, i) => lines[files.length + i] !== "active");
      if (bad.length || inactive.length) {
        throw new Error(`${by} on ${host.name}: wrong or missing files [${bad}], inactive units [${inactive}]`);
      }
    }));
  }

  /**
   * Epoch ms at which each instance became ready (the later of its two units entering "active"), by instance name.
   * The lab hosts share this machine's clock, so these compare with timestamps taken here.
   */
  async readyTimes(host: LabHost, names: string[]): Promise<Map<string, number>> {
    const units = names.flatMap((n) => [`${n}-runtime.service`, `${n}-exporter.service`]);
    const out = await this.#exec(
      host,
      `systemctl show --timestamp=us+utc -p Id -p ActiveEnterTimestamp ${units.map(shQuote).join(" ")}`,
    );
    const ready = new Map<string, number>();
    for (const block of out.split("\n\n")) {
      const id = /^Id=(.+)-(?:runtime|exporter)\.service$/m.exec(block)?.[1];
      const at = /^ActiveEnterTimestamp=\S+ (\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d)\.(\d{6}) UTC$/m.exec(block);
      if (!id || !at) continue;
      const ms = Date.parse(`${at[1]}T${at[2]}Z`) + Number(at[3]) / 1000;
      ready.set(id, Math.max(ready.get(id) ?? 0, ms));
    }
    return ready;
  }

  /**
   * SSH connections the hosts accepted between two moments (epoch ms), from sshd's "Accepted publickey" lines. The
   * probe's own connection is opened once, before any measurement, so it never falls inside a window.
   */
  async sshLogins(hosts: LabHost[], fromMs: number, toMs: number): Promise<number> {
    const at = (ms: number) => `@${(ms / 1000).toFixed(3)}`;
    const counts = await Promise.all(hosts.map(async (h) =>
      Number(
        (await this.#exec(
          h,
          `journalctl -q --since ${at(fromMs)} --until ${at(toMs)} -o cat | grep -c '^Accepted publickey' || true`,
        )).trim(),
      )
    ));
    return counts.reduce((a, b) => a + b, 0);
  }

  close(): Promise<void> {
    return this.#pool.close();
  }
}

export const sha256 = (s: string) => createHash("sha256").update(s, "utf8").digest("hex");
