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
  /** storage.size as stated: the QEMU driver's disk_size. Absent: the driver's own default. */
  storage?: string;
  /** Bytes of the instance's /disk volume: storage.size (default 10Gi) plus storage.fsOverhead (default 10%). */
  diskBytes: number;
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

/** Upstream's defaults for the /disk volume (PR #928, `parameters.storage`). */
export const DEFAULT_STORAGE_SIZE = "10Gi";
export const DEFAULT_FS_OVERHEAD = "10%";

const PERCENT_RE = /^([0-9]{1,3}(?:\.[0-9]{1,3})?)%$/;

/**
 * `storage.fsOverhead` in bytes: a percentage of the size ("10%", "2.5%", at most 100%) or a quantity ("1Gi", "0"),
 * as upstream adds it to the volume. Undefined when it is neither.
 */
export function overheadBytes(overhead: string, sizeBytes: number): number | undefined {
  const pct = PERCENT_RE.exec(overhead);
  if (pct) return Number(pct[1]) <= 100 ? Math.ceil(sizeBytes * Number(pct[1]) / 100) : undefined;
  return quantityBytes(overhead);
}

/**
 * The /disk volume's size: size plus overhead, rounded up to whole MiB (the file system image is made in blocks).
 * Assumes values that passed validation.
 */
export function diskVolumeBytes(size: string, overhead: string): number {
  const bytes = quantityBytes(size)!;
  return Math.ceil((bytes + overheadBytes(overhead, bytes)!) / 2 ** 20) * 2 ** 20;
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
