/**
 * The resync check: one inspection of a lab host answers for every instance on it. Drift checks of all sets there
 * and the orphan sweep share the latest inspection that is recent enough, so a host that needs nothing costs one SSH
 * command per resync, however many instances it runs.
 */
import { createHash } from "node:crypto";
import { drift, starting } from "../host/drift.ts";
import type { RenderedInstance } from "../host/render.ts";
import type { LabTarget } from "./credentials.ts";
import type { Context, HostCheck } from "./context.ts";
import { targetString } from "./targets.ts";
import { factsKey, factsWire } from "../host/host_facts.ts";

/**
 * An inspection of the host begun after `since`: the one under way or done, else a new one. Keyed by the key
 * too, so one class's access never stands in for another's; a failed one is forgotten so the next caller tries again.
 */
export function inspectHost(ctx: Context, target: LabTarget, since: number): HostCheck {
  const key = `${targetString(target)} ${createHash("sha256").update(target.privateKey).digest("hex").slice(0, 16)}`;
  const last = ctx.inspections.get(key);
  if (last && last.at > since) return last;
  const check = { at: ctx.now().getTime(), inspection: ctx.hosts.inspect(target) };
  ctx.inspections.set(key, check);
  check.inspection.catch(() => {
    if (ctx.inspections.get(key) === check) ctx.inspections.delete(key);
  });
  return check;
}

/**
 * How the instance differs on its host from `r` (see drift), and which of its units are still on their way up
 * (starting), by an inspection begun after `since`. Facts of the host that differ from those `r` was rendered for
 * count too (its kvm group or Podman changed): the inspection's facts are remembered, and the apply that follows
 * renders for them.
 */
export async function driftSince(
  ctx: Context,
  target: LabTarget,
  r: RenderedInstance,
  since: number,
): Promise<{ at: number; drift: string[]; starting: string[] }> {
  const check = inspectHost(ctx, target, since);
  const inspection = await check.inspection;
  const found = inspection.instances.find((i) => i.name === r.name);
  const differs = drift(r, found);
  if (inspection.facts) {
    ctx.hostFacts.set(factsKey(target), inspection.facts);
    const [was, now] = [factsWire(r.facts), factsWire(inspection.facts)];
    if (was !== now) differs.push(`host facts: rendered for ${was}, the host is ${now}`);
  }
  return { at: check.at, drift: differs, starting: starting(r, found) };
}

/** Drops inspections begun before `before`, older than any caller takes, so hosts no longer used are not kept. */
export function forgetOldInspections(ctx: Context, before: number): void {
  for (const [key, check] of ctx.inspections) if (check.at < before) ctx.inspections.delete(key);
}
