/**
 * The resync check: one inspection of a lab host answers for every instance on it. Drift checks of all sets there
 * and the orphan sweep share the latest inspection that is recent enough, so a host that needs nothing costs one SSH
 * command per resync, however many instances it runs. The close looks at units on their way up ask the host for its
 * units only, shared the same way.
 */
import { createHash } from "node:crypto";
import { drift, starting, unitsLook } from "../host/drift.ts";
import type { RenderedInstance } from "../host/render.ts";
import type { HostInspection } from "../host/remote.ts";
import type { LabTarget } from "./credentials.ts";
import type { Context, HostLook } from "./context.ts";
import { targetString } from "./targets.ts";
import { factsKey, factsWire } from "../host/host_facts.ts";

/** What a look at the instance on its host found: how it differs (see drift), and which units are starting. */
export interface Checked {
  at: number;
  drift: string[];
  starting: string[];
}

/** Looks are kept per host and key, so one class's access never stands in for another's. */
const lookKey = (target: LabTarget) =>
  `${targetString(target)} ${createHash("sha256").update(target.privateKey).digest("hex").slice(0, 16)}`;

/**
 * The look in `looks` begun after `since`: the one under way or done, else a new one. A failed one is forgotten so
 * the next caller tries again.
 */
function lookSince<T>(
  ctx: Context,
  looks: Map<string, HostLook<T>>,
  target: LabTarget,
  since: number,
  start: () => Promise<T>,
): HostLook<T> {
  const key = lookKey(target);
  const last = looks.get(key);
  if (last && last.at > since) return last;
  const look = { at: ctx.now().getTime(), result: start() };
  looks.set(key, look);
  look.result.catch(() => {
    if (looks.get(key) === look) looks.delete(key);
  });
  return look;
}

/** An inspection of the host begun after `since` (see lookSince). */
export function inspectHost(ctx: Context, target: LabTarget, since: number): HostLook<HostInspection> {
  return lookSince(ctx, ctx.inspections, target, since, () => ctx.hosts.inspect(target));
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
): Promise<Checked> {
  const check = inspectHost(ctx, target, since);
  const inspection = await check.result;
  const found = inspection.instances.find((i) => i.name === r.name);
  const differs = drift(r, found);
  if (inspection.facts) {
    ctx.hostFacts.set(factsKey(target), inspection.facts);
    const [was, now] = [factsWire(r.facts), factsWire(inspection.facts)];
    if (was !== now) differs.push(`host facts: rendered for ${was}, the host is ${now}`);
  }
  return { at: check.at, drift: differs, starting: starting(r, found) };
}

/**
 * How long a units-only look waits on the host for starts under way to end (lab.ts units): about as long as a start
 * takes on a lab host, so that units are seen up within a tenth of a second of coming up, by one look or two.
 */
export const STARTING_WAIT_MS = 1_000;

/**
 * The same question for units alone, by a units-only inspection begun after `since` (or a whole one, when one began
 * since): units down count as drift, files are left to the resync's look.
 */
export async function unitsSince(
  ctx: Context,
  target: LabTarget,
  r: RenderedInstance,
  since: number,
): Promise<Checked> {
  if ((ctx.inspections.get(lookKey(target))?.at ?? -Infinity) > since) return driftSince(ctx, target, r, since);
  const look = lookSince(
    ctx,
    ctx.unitLooks,
    target,
    since,
    () => ctx.hosts.units(target, { waitMs: STARTING_WAIT_MS }),
  );
  return { at: look.at, ...unitsLook(r, (await look.result).units) };
}

/** Drops looks begun before `before`, older than any caller takes, so hosts no longer used are not kept. */
export function forgetOldInspections(ctx: Context, before: number): void {
  for (const looks of [ctx.inspections, ctx.unitLooks]) {
    for (const [key, look] of looks) if (look.at < before) looks.delete(key);
  }
}
