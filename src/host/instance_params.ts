/**
 * The validated parameters of one instance: what provision/params.ts makes of a class and set, and what render.ts
 * turns into units. Here, in the host layer, so that rendering needs nothing from provisioning. Pure.
 */
import type { HostKeyPolicy } from "./ssh.ts";

export type PullPolicy = "Always" | "IfNotPresent" | "Never";

export interface ImageChoice {
  image: string;
  pullPolicy: PullPolicy;
}

export interface InstanceParams {
  host: { name: string; user: string; port: number };
  hostKeyPolicy?: HostKeyPolicy;
  runtime: { kvm: boolean; devices: string[] };
  arch?: string;
  cpu?: number;
  memory?: string;
  storage?: string;
  images: { exporter: ImageChoice; runtime: ImageChoice };
}

export const QEMU_DRIVER_TYPE = "jumpstarter_driver_qemu.driver.Qemu";

// ---------------------------------------------------------------- quantities

const QUANTITY_RE = /^([0-9]+)(Ki|Mi|Gi|Ti|K|M|G|T)?$/;
const UNIT_BYTES: Record<string, number> = {
  "": 1,
  K: 1e3,
  M: 1e6,
  G: 1e9,
  T: 1e12,
  Ki: 2 ** 10,
  Mi: 2 ** 20,
  Gi: 2 ** 30,
  Ti: 2 ** 40,
};

export function quantityBytes(q: string): number | undefined {
  const m = QUANTITY_RE.exec(q);
  return m ? Number(m[1]) * UNIT_BYTES[m[2] ?? ""] : undefined;
}

/**
 * A Kubernetes quantity as QEMU writes sizes (`-m`, `qemu-img resize`), whose suffixes are binary: `4Gi` -> `4G`,
 * `512Mi` -> `512M`, as upstream does. Decimal and plain-byte quantities are converted exactly rather than by
 * dropping the `i` (`4G` is 4e9 bytes, not 4 GiB): to the largest binary unit that divides them, else rounded up to
 * whole MiB, which QEMU needs anyway. Assumes a quantity that passed validation.
 */
export function qemuQuantity(q: string): string {
  const m = QUANTITY_RE.exec(q);
  if (!m) throw new Error(`not a quantity: ${JSON.stringify(q)}`);
  if (m[2]?.endsWith("i")) return `${m[1]}${m[2][0]}`;
  const bytes = quantityBytes(q)!;
  for (const [unit, size] of [["T", 2 ** 40], ["G", 2 ** 30], ["M", 2 ** 20]] as const) {
    if (bytes % size === 0) return `${bytes / size}${unit}`;
  }
  return `${Math.ceil(bytes / 2 ** 20)}M`;
}
