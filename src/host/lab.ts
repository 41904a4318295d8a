/**
 * What the reconciler does on a lab host: apply, remove, inspect (all, or only the units). Each is one script over
 * one pooled SSH channel (remote.ts builds the scripts and parses their output; ssh.ts carries them).
 */
import type { RenderedInstance } from "./render.ts";
import type { HostFacts } from "./host_facts.ts";
import {
  type ApplyOptions,
  type ApplyReport,
  applyScript,
  type HostInspection,
  type HostUnits,
  inspectScript,
  parseApplyOutput,
  parseInspectOutput,
  parseRemoveOutput,
  parseUnitsOutput,
  removeScript,
  type ScriptError,
  shellCommand,
  unitsScript,
} from "./remote.ts";
import { SshError, type SshPool, type SshTarget } from "./ssh.ts";
import { LAB_HOSTS_ENV } from "./lab_hosts.ts";
import type { Metrics } from "../observe/metrics.ts";

export interface ApplyOutcome {
  changed: string[];
  /** Both units active. */
  ready: boolean;
  /**
   * Not ready, but nothing is down: a unit is on its way up (activating, or waiting on its queued start), which the
   * apply does not wait for.
   */
  starting: boolean;
  /** The exporter ended by itself (clean exit) and was left stopped (keepExited). */
  exited: boolean;
  /** Running units were left on an older definition (deferRestart): the instance is outdated until applied again. */
  restartPending: boolean;
  /** This apply started an exporter that was down. */
  startedExporter: boolean;
  /** systemd's restarts of the exporter after crashes, since it was last started by hand or by us. */
  exporterRestarts: number;
  /** The exporter's last journal lines when it is down or has restarted, tokens redacted. */
  journal: string[];
  errors: string[];
  /** The first error's code, e.g. "kvm-missing". */
  errorCode?: string;
  /** The host's facts as the apply found them; absent if it stopped before (a missing tool, a lost connection). */
  facts?: HostFacts;
}

export type HostApplyOptions =
  & Required<Pick<ApplyOptions, "kvmRequired" | "keepExited">>
  & Pick<ApplyOptions, "deferRestart">;

export interface HostOps {
  apply(
    target: SshTarget,
    r: RenderedInstance,
    opts: HostApplyOptions,
  ): Promise<ApplyOutcome>;
  /** With a uid, files that name another exporter are refused (owner-conflict), not removed. */
  remove(target: SshTarget, name: string, uid?: string): Promise<void>;
  inspect(target: SshTarget): Promise<HostInspection>;
  /**
   * Only the units of the host's instances and their queued jobs: a few processes on the host, not a hundred. With
   * `waitMs`, as soon as no start of theirs is under way, or once that long has passed.
   */
  units(target: SshTarget, opts?: UnitsOptions): Promise<HostUnits>;
}

export interface UnitsOptions {
  waitMs?: number;
}

export class HostScriptError extends Error {
  constructor(readonly host: string, readonly code: string, message: string) {
    super(message);
    this.name = "HostScriptError";
  }
}

export interface LabHostsOptions {
  /** Lab host name -> address to connect to; host keys are still checked under the name. */
  hostAliases?: Record<string, string>;
  /** --lab-hosts, named when the network permission refuses a host. */
  labHosts?: string;
  metrics?: Metrics;
  /**
   * Once aborted (this replica lost leadership), no command starts and running ones are killed: another replica may
   * be about to lead and work on the same hosts.
   */
  fence?: AbortSignal;
}

export class LabHosts implements HostOps {
  constructor(private readonly pool: SshPool, private readonly opts: LabHostsOptions = {}) {}

  private async run(target: SshTarget, script: string) {
    const address = this.opts.hostAliases?.[target.host];
    const started = performance.now();
    try {
      return await this.pool.exec(address ? { ...target, address } : target, shellCommand(target.user), {
        stdin: script,
        signal: this.opts.fence,
      });
    } catch (e) {
      this.opts.metrics?.sshCommandErrors.inc({ host: target.host, kind: e instanceof SshError ? e.kind : "other" });
      // Deno's own words ("Requires net access to ...") do not say which setting grants it. The pool may throw
      // one error object again while it backs off: it is reworded once.
      const refused = e instanceof SshError && /^ssh .*Requires net access/.test(e.message);
      if (refused && this.opts.labHosts !== undefined) {
        e.message = `lab host ${target.host}${address ? ` (${address})` : ""} port ${target.port} is not in ` +
          `--lab-hosts (${this.opts.labHosts}): add it to the controller's --lab-hosts flag or ${LAB_HOSTS_ENV} ` +
          `variable; ${e.message}`;
      }
      throw e;
    } finally {
      this.opts.metrics?.sshCommandSeconds.observe({ host: target.host }, (performance.now() - started) / 1000);
    }
  }

  async apply(
    target: SshTarget,
    r: RenderedInstance,
    opts: HostApplyOptions,
  ): Promise<ApplyOutcome> {
    const res = await this.run(target, applyScript(r, opts));
    const report = parseApplyOutput(res.stdout, res.stderr, res.code);
    const rt = report.states[r.units.runtime];
    const ex = report.states[r.units.exporter];
    const ready = rt?.active === "active" && ex?.active === "active";
    const exited = report.exited.includes(r.units.exporter);
    return {
      changed: report.changed,
      ready,
      starting: !ready && !exited && report.ok &&
        [r.units.runtime, r.units.exporter].every((u) => upOrQueued(u, report)),
      exited,
      restartPending: report.pending.length > 0,
      // a restart for a change is not the exporter going down
      startedExporter: report.started.includes(r.units.exporter),
      exporterRestarts: ex?.restarts ?? 0,
      journal: report.journal,
      errors: report.errors.map((e) => `${e.code}: ${e.message}`),
      errorCode: report.errors[0]?.code,
      facts: report.facts,
    };
  }

  async remove(target: SshTarget, name: string, uid?: string): Promise<void> {
    const res = await this.run(target, removeScript(name, { uid }));
    failUnlessOk(target, parseRemoveOutput(res.stdout, res.stderr, res.code));
  }

  async inspect(target: SshTarget): Promise<HostInspection> {
    const res = await this.run(target, inspectScript());
    return failUnlessOk(target, parseInspectOutput(res.stdout, res.stderr, res.code));
  }

  async units(target: SshTarget, opts: UnitsOptions = {}): Promise<HostUnits> {
    const res = await this.run(target, unitsScript(opts.waitMs));
    return failUnlessOk(target, parseUnitsOutput(res.stdout, res.stderr, res.code));
  }
}

/** The unit as the apply left it: up, on its way up, or with a start or restart that the apply queued. */
function upOrQueued(unit: string, report: ApplyReport): boolean {
  const active = report.states[unit]?.active;
  return active === "active" || active === "activating" || active === "reloading" || report.started.includes(unit) ||
    report.restarted.includes(unit);
}

/**
 * Applies an instance rendered for its host's facts: first for `known`, the facts last seen there (on first contact,
 * a guess or undefined). When the host's apply script finds other facts it refuses before writing anything, and the instance is
 * rendered for the facts it reported and applied again at once: one round trip while nothing changes, two when
 * something did. `onFacts` hears the facts each round trip reports as soon as it ends (on first contact, others on
 * the host wait for them: first_contact.ts). Returns what was applied last and what the host said.
 */
export async function applyForFacts(
  hosts: HostOps,
  target: SshTarget,
  render: (facts: HostFacts | undefined) => RenderedInstance,
  known: HostFacts | undefined,
  opts: HostApplyOptions,
  onFacts?: (facts: HostFacts) => void,
): Promise<{ rendered: RenderedInstance; outcome: ApplyOutcome }> {
  let rendered = render(known);
  let outcome = await hosts.apply(target, rendered, opts);
  if (outcome.facts) onFacts?.(outcome.facts);
  const onlyFacts = outcome.errors.length > 0 && outcome.errors.every((e) => e.startsWith("facts-changed:"));
  if (onlyFacts && outcome.facts) {
    rendered = render(outcome.facts);
    outcome = await hosts.apply(target, rendered, opts);
    if (outcome.facts) onFacts?.(outcome.facts);
  }
  return { rendered, outcome };
}

function failUnlessOk<R extends { ok: boolean; errors: ScriptError[] }>(target: SshTarget, report: R): R {
  if (report.ok) return report;
  const message = report.errors.map((x) => `${x.code}: ${x.message}`).join("; ");
  throw new HostScriptError(target.host, report.errors[0]?.code ?? "exit", message);
}
