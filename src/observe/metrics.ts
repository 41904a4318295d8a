/** Prometheus metrics in text exposition format, without a client library (a few counters and histograms). */

type Labels = Record<string, string>;
/** One series of a value read at scrape time: its labels and value. */
export type Sample = [Labels, number];

const labelKey = (l: Labels) =>
  Object.entries(l).sort(([a], [b]) => a.localeCompare(b)).map(([k, v]) => `${k}="${escape(v)}"`).join(",");
const escape = (v: string) => v.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n");
const braces = (s: string) => (s ? `{${s}}` : "");

abstract class Metric {
  constructor(readonly name: string, readonly help: string, readonly type: string) {}
  abstract samples(): string[];
  render(): string {
    return [`# HELP ${this.name} ${this.help}`, `# TYPE ${this.name} ${this.type}`, ...this.samples()].join("\n");
  }
}

export class Counter extends Metric {
  private readonly values = new Map<string, number>();
  constructor(name: string, help: string) {
    super(name, help, "counter");
  }
  inc(labels: Labels = {}, by = 1): void {
    const k = labelKey(labels);
    this.values.set(k, (this.values.get(k) ?? 0) + by);
  }
  get(labels: Labels = {}): number {
    return this.values.get(labelKey(labels)) ?? 0;
  }
  samples(): string[] {
    return [...this.values].map(([k, v]) => `${this.name}${braces(k)} ${v}`);
  }
}

/** A value read at scrape time from where it is kept (queue depth, instance counts, a request counter). */
export class Gauge extends Metric {
  constructor(
    name: string,
    help: string,
    private readonly collect: () => Sample[],
    type: "gauge" | "counter" = "gauge",
  ) {
    super(name, help, type);
  }
  samples(): string[] {
    return this.collect().map(([l, v]) => `${this.name}${braces(labelKey(l))} ${v}`);
  }
}

const BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];

export class Histogram extends Metric {
  private readonly series = new Map<string, { counts: number[]; sum: number; count: number }>();
  constructor(name: string, help: string) {
    super(name, help, "histogram");
  }
  observe(labels: Labels, seconds: number): void {
    const k = labelKey(labels);
    const s = this.series.get(k) ?? { counts: BUCKETS.map(() => 0), sum: 0, count: 0 };
    BUCKETS.forEach((b, i) => {
      if (seconds <= b) s.counts[i]++;
    });
    s.sum += seconds;
    s.count++;
    this.series.set(k, s);
  }
  samples(): string[] {
    const out: string[] = [];
    for (const [k, s] of this.series) {
      const sep = k ? `${k},` : "";
      BUCKETS.forEach((b, i) => out.push(`${this.name}_bucket{${sep}le="${b}"} ${s.counts[i]}`));
      out.push(`${this.name}_bucket{${sep}le="+Inf"} ${s.count}`);
      out.push(`${this.name}_sum${braces(k)} ${s.sum}`, `${this.name}_count${braces(k)} ${s.count}`);
    }
    return out;
  }
}

/** The controller's metrics; names follow controller-runtime where one exists. */
export class Metrics {
  readonly reconcileTotal = new Counter("controller_runtime_reconcile_total", "Reconciles by result.");
  readonly reconcileErrors = new Counter("controller_runtime_reconcile_errors_total", "Reconciles that failed.");
  readonly reconcileSeconds = new Histogram("controller_runtime_reconcile_time_seconds", "Reconcile duration.");
  readonly sshCommandSeconds = new Histogram("qemu_ssh_command_seconds", "SSH command round trips per host.");
  readonly sshConnections = new Counter("qemu_ssh_connections_opened_total", "SSH connections opened per host.");
  /** By SshError kind (connect, timeout, auth, hostkey, key, closed), or "other": what an alert on a host reads. */
  readonly sshCommandErrors = new Counter(
    "qemu_ssh_command_errors_total",
    "SSH commands that did not complete, per host and kind of failure.",
  );
  readonly deploySeconds = new Histogram("qemu_ssh_deploy_seconds", "Time to apply one instance on its host.");
  private readonly extra: Metric[] = [];

  /** Adds a value read at scrape time (queue depth; a counter kept elsewhere, with type "counter"). */
  gauge(name: string, help: string, collect: () => Sample[], type: "gauge" | "counter" = "gauge"): void {
    this.extra.push(new Gauge(name, help, collect, type));
  }

  render(): string {
    const all: Metric[] = [
      this.reconcileTotal,
      this.reconcileErrors,
      this.reconcileSeconds,
      this.sshCommandSeconds,
      this.sshConnections,
      this.sshCommandErrors,
      this.deploySeconds,
      ...this.extra,
    ];
    return all.map((m) => m.render()).join("\n") + "\n";
  }
}
