/**
 * Drift: how an instance on its host differs from what the controller rendered for it, read from one inspection of
 * the host. Pure; the resync check (provision/host_checks.ts) applies again only instances that drifted.
 */
import type { RenderedFile, RenderedInstance } from "./render.ts";
import { type HostUnits, type InspectedInstance, type InspectedUnit, sha256 } from "./remote.ts";

/**
 * What differs, one phrase each (empty: nothing does). Files as the apply script writes them; both units active or
 * on their way up (`starting`: not ready yet, which another apply would not help).
 */
export function drift(r: RenderedInstance, found: InspectedInstance | undefined): string[] {
  if (!found) return ["not on the host"];
  const have = new Map(found.files.map((f) => [f.path, f]));
  const out: string[] = [];
  for (const f of r.files) {
    const content = sha256(f.content);
    const mode = modeOf(f);
    for (const path of [f.path, ...f.links]) {
      const h = have.get(path);
      if (!h) out.push(`${path} is missing`);
      else if (h.sha256 !== content) out.push(`${path} was changed`);
      else if (h.mode !== mode) out.push(`${path} has mode and owner ${h.mode ?? "unknown"}, not ${mode}`);
    }
  }
  out.push(...unitsDown(r, found));
  for (const unit of found.outdated ?? []) out.push(`${unit} runs an older definition than its quadlet's`);
  if (!found.volume) out.push(`volume ${r.volume} is missing`);
  if (!found.diskVolume) out.push(`volume ${r.disk.volume} is missing`);
  return out;
}

/** The instance's units as an inspection found them, of the whole host or of its units only (HostUnits). */
type FoundUnits = Pick<InspectedInstance, "runtime" | "exporter">;

/**
 * What a units-only inspection tells of the instance: its units neither active nor on their way up (all it can tell of
 * drift), and those on their way up (see starting).
 */
export function unitsLook(r: RenderedInstance, units: HostUnits["units"]): { drift: string[]; starting: string[] } {
  const found = { runtime: units[r.units.runtime], exporter: units[r.units.exporter] };
  return { drift: unitsDown(r, found), starting: starting(r, found) };
}

/** Its units neither active nor on their way up, one phrase each. */
function unitsDown(r: RenderedInstance, found: FoundUnits): string[] {
  return unitsOf(r, found).filter(([, s]) => s?.active !== "active" && !isStarting(s)).map(([unit, s]) =>
    `${unit} is ${s ? s.active : "not loaded"}`
  );
}

/**
 * The instance's units on their way up, one phrase each: an apply queued their start (or restart) moments ago, or
 * systemd waits to restart them. The instance can take a lease once this is empty and nothing drifted.
 */
export function starting(r: RenderedInstance, found: FoundUnits | undefined): string[] {
  if (!found) return [];
  return unitsOf(r, found).filter(([, s]) => isStarting(s)).map(([unit, s]) =>
    `${unit} is ${s!.job ? `${s!.active} with a ${s!.job} job queued` : `${s!.active} (${s!.sub})`}`
  );
}

// activating covers a start under way and systemd's wait before an automatic restart (sub auto-restart); a unit
// with a start or restart job queued reads whatever it was until the job runs
function isStarting(s: InspectedUnit | undefined): boolean {
  return s?.active === "activating" || s?.job === "start" || s?.job === "restart";
}

const unitsOf = (r: RenderedInstance, found: FoundUnits): [string, InspectedUnit | undefined][] => [
  [r.units.runtime, found.runtime],
  [r.units.exporter, found.exporter],
];

/** A rendered file's mode and owner as inspect reports them (stat's %a:%u:%g), the apply having set both. */
export const modeOf = (f: RenderedFile) => `${f.mode.toString(8)}:${f.owner}:${f.owner}`;
