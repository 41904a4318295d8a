/**
 * `render`: the files `run` would write on a lab host for an ExporterSet, from its manifests alone (no cluster, no
 * host), to review a class and a set before applying them. What only the cluster knows is a placeholder: the token
 * (never printed), the Exporter's uid, the CA bundle and, unless given, the Exporter's name and endpoint.
 *
 * Also the few pieces the CLI commands share: where they print, and how they report flags and parameters.
 */
import { parseArgs } from "node:util";
import { parseAllDocuments } from "yaml";
import { type ExporterSet, PROVISIONER, type VirtualTargetClass } from "../api/types.ts";
import { fieldErrorLine, resolveParams } from "../provision/params.ts";
import { targetString } from "../provision/targets.ts";
import { instanceOf, type RenderedInstance, renderInstance } from "../host/render.ts";

export const RENDER_USAGE =
  `usage: qemu-ssh-provisioner render --class CLASS.yaml --set SET.yaml [--exporter NAME] [--endpoint E]
       qemu-ssh-provisioner render -f MANIFESTS.yaml [-f ...] [--exporter NAME] [--endpoint E]

Prints, for each ExporterSet in the files, what run would write on its lab host: the ExporterConfig and the two
quadlets with their paths, the volume and the units. Offline: nothing is read from a cluster or a host. The set's
VirtualTargetClass (spec.virtualTargetClassName, same namespace) must be in the files too.

  --class FILE, --set FILE, -f FILE   manifests (-f is also --file), YAML, any number of documents; repeatable
  --exporter NAME                     the Exporter's name (default SET-xxxxx); only with a single ExporterSet
  --endpoint HOST:PORT                the Jumpstarter endpoint for the ExporterConfig (default <endpoint>)

The token is shown as <redacted>; the Exporter's uid and the CA bundle (tls.ca) are placeholders.
Exit status: 0 rendered, 1 invalid manifests or parameters (one line each), 2 usage error.`;

export const REDACTED = "<redacted>";
/** Stands for the uid the API server gives the Exporter; it only appears in ownership lines and labels. */
export const PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000";
const PLACEHOLDER_ENDPOINT = "<endpoint>";
const DEFAULT_NAMESPACE = "default";

/** Where a command prints: its result to `out`, problems to `err`. Tests pass their own. */
export interface Io {
  out(text: string): void;
  err(text: string): void;
}

export const consoleIo: Io = { out: (t) => console.log(t), err: (t) => console.error(t) };

/**
 * A command's flags from `parse`, or the exit status when there is nothing to run: 0 after --help, 2 after a bad
 * flag (the reason and the usage go to stderr, without a stack trace). `parse` only parses, so whatever it throws
 * is a usage error.
 */
export function parseFlags<T extends object>(
  usage: string,
  args: string[],
  io: Io,
  parse: (args: string[]) => T,
): T | number {
  if (args.includes("--help") || args.includes("-h")) {
    io.out(usage);
    return 0;
  }
  try {
    return parse(args);
  } catch (e) {
    io.err(`error: ${e instanceof Error ? e.message : e}\n\n${usage}`);
    return 2;
  }
}

export interface RenderFlags {
  files: string[];
  exporter?: string;
  endpoint?: string;
}

export function parseRenderFlags(args: string[]): RenderFlags {
  const { values, positionals } = parseArgs({
    args,
    strict: true,
    allowPositionals: true,
    options: {
      class: { type: "string", multiple: true, default: [] },
      set: { type: "string", multiple: true, default: [] },
      file: { type: "string", short: "f", multiple: true, default: [] },
      exporter: { type: "string" },
      endpoint: { type: "string" },
    },
  });
  if (positionals.length) throw new Error(`unexpected argument "${positionals[0]}"`);
  const files = [...values.class, ...values.set, ...values.file];
  if (!files.length) throw new Error("no manifests: give --class CLASS.yaml --set SET.yaml, or -f MANIFESTS.yaml");
  return { files, exporter: values.exporter, endpoint: values.endpoint };
}

export async function renderCommand(args: string[], io: Io = consoleIo): Promise<number> {
  const flags = parseFlags(RENDER_USAGE, args, io, parseRenderFlags);
  if (typeof flags === "number") return flags;
  const sources: Manifest[] = [];
  for (const path of flags.files) {
    try {
      sources.push({ path, text: await Deno.readTextFile(path) });
    } catch (e) {
      io.err(`${path}: cannot read: ${e instanceof Error ? e.message : e}`);
      return 1;
    }
  }
  const result = renderManifests(sources, flags);
  for (const w of result.warnings) io.err(`warning: ${w}`);
  if (!result.ok) {
    for (const e of result.errors) io.err(e);
    return 1;
  }
  io.out(result.text);
  return 0;
}

export interface Manifest {
  /** Where the text came from, for messages. */
  path: string;
  text: string;
}

export type RenderResult =
  | { ok: true; text: string; warnings: string[] }
  | { ok: false; errors: string[]; warnings: string[] };

/** Renders every ExporterSet in the manifests with its class, as `run` would deploy a new Exporter of it. Pure. */
export function renderManifests(
  manifests: Manifest[],
  opts: { exporter?: string; endpoint?: string } = {},
): RenderResult {
  const errors: string[] = [];
  const warnings: string[] = [];
  const classes: VirtualTargetClass[] = [];
  const sets: ExporterSet[] = [];
  for (const { path, text } of manifests) {
    for (const [i, doc] of parseAllDocuments(text).entries()) {
      if (doc.errors.length) {
        errors.push(...doc.errors.map((e) => `${path}: document ${i + 1}: ${e.message}`));
        continue;
      }
      const obj = doc.toJS() as Partial<VirtualTargetClass | ExporterSet> | null;
      if (obj?.kind !== "VirtualTargetClass" && obj?.kind !== "ExporterSet") continue;
      // what the API server's schema would refuse, and the code below relies on
      if (typeof obj.metadata?.name !== "string" || typeof obj.spec !== "object" || obj.spec === null) {
        errors.push(`${path}: document ${i + 1}: a ${obj.kind} needs metadata.name and spec`);
      } else if (obj.kind === "VirtualTargetClass") classes.push(obj as VirtualTargetClass);
      else if (typeof (obj as ExporterSet).spec.virtualTargetClassName !== "string") {
        errors.push(
          `ExporterSet ${obj.metadata.name}: spec.virtualTargetClassName: missing: name the VirtualTargetClass`,
        );
      } else sets.push(obj as ExporterSet);
    }
  }
  if (errors.length) return { ok: false, errors, warnings };
  if (!sets.length) {
    const where = manifests.map((m) => m.path).join(", ");
    return { ok: false, errors: [`no ExporterSet in ${where}: give the set's manifest too`], warnings };
  }
  if (opts.exporter !== undefined && sets.length > 1) {
    const names = sets.map((s) => s.metadata.name).join(", ");
    return {
      ok: false,
      errors: [`--exporter names one Exporter, but the files hold ${sets.length} ExporterSets (${names})`],
      warnings,
    };
  }

  const out: string[] = [];
  for (const set of sets) {
    const ns = set.metadata.namespace ?? DEFAULT_NAMESPACE;
    const className = set.spec.virtualTargetClassName;
    const cls = classes.find((c) =>
      c.metadata.name === className && (c.metadata.namespace ?? DEFAULT_NAMESPACE) === ns
    );
    if (!cls) {
      const have = classes.map((c) => `${c.metadata.namespace ?? DEFAULT_NAMESPACE}/${c.metadata.name}`);
      errors.push(
        `ExporterSet ${set.metadata.name}: spec.virtualTargetClassName: no VirtualTargetClass ${ns}/${className} in ` +
          `the files (${have.length ? `they have ${have.join(", ")}` : "they have none"}): add its manifest`,
      );
      continue;
    }
    if (cls.spec.provisioner !== PROVISIONER) {
      errors.push(
        `VirtualTargetClass ${className}: spec.provisioner: "${cls.spec.provisioner}" is another provisioner's; ` +
          `set it to ${PROVISIONER} for this one to deploy the set`,
      );
      continue;
    }
    const resolved = resolveParams(cls, set);
    if (!resolved.ok) {
      errors.push(...resolved.errors.map(fieldErrorLine));
      continue;
    }
    warnings.push(...resolved.warnings);
    try {
      const rendered = renderInstance(
        instanceOf({ ...set, metadata: { ...set.metadata, namespace: ns } }, resolved.params, {
          name: opts.exporter ?? `${set.metadata.name}-xxxxx`,
          uid: PLACEHOLDER_UID,
          endpoint: opts.endpoint ?? PLACEHOLDER_ENDPOINT,
          token: REDACTED,
          caBundle: "",
        }),
      );
      const { host } = resolved.params;
      out.push(describe(set, ns, rendered, targetString({ user: host.user, host: host.name, port: host.port })));
    } catch (e) {
      // names and the endpoint are checked only here, as they become file names and unit file values
      errors.push(`ExporterSet ${set.metadata.name}: ${e instanceof Error ? e.message : e}`);
    }
  }
  return errors.length ? { ok: false, errors, warnings } : { ok: true, text: out.join("\n\n"), warnings };
}

function describe(set: ExporterSet, ns: string, r: RenderedInstance, host: string): string {
  const lines = [
    `# ExporterSet ${ns}/${set.metadata.name} (VirtualTargetClass ${set.spec.virtualTargetClassName}), ` +
    `Exporter ${r.name}`,
    `# host:   ${host}`,
    `# volume: ${r.volume}`,
    `# units:  ${r.units.runtime} ${r.units.exporter}`,
    `# token ${REDACTED}; uid ${PLACEHOLDER_UID} and an empty tls.ca stand for what the cluster provides`,
  ];
  for (const f of r.files) {
    const links = f.links.length ? `, linked as ${f.links.join(", ")}` : "";
    lines.push(
      "",
      `==> ${f.path} (mode ${f.mode.toString(8).padStart(4, "0")}${links}) <==`,
      f.content.replace(/\n$/, ""),
    );
  }
  return lines.join("\n");
}
