/**
 * `render`: the files `run` would write on a lab host for an ExporterSet, from its manifests alone (no cluster, no
 * host), to review a class and a set before applying them. What only the cluster knows is a placeholder: the token
 * (never printed), the Exporter's uid, the CA bundle and, unless given, the Exporter's name and endpoint.
 *
 * Also the few pieces the CLI commands share: where they print, and how they report flags and parameters.
 */
import { parseArgs } from "node:util";
import { parseAllDocuments, stringify } from "yaml";
import { type ExporterSet, PROVISIONER, type VirtualTargetClass } from "../api/types.ts";
import { fieldErrorLine, resolveParams } from "../provision/params.ts";
import { targetString } from "../provision/targets.ts";
import { instanceOf, type RenderedInstance, renderInstance } from "../host/render.ts";
import { type HostFacts, parseFacts } from "../host/host_facts.ts";

export const RENDER_USAGE =
  `usage: qemu-ssh-provisioner render --class CLASS.yaml --set SET.yaml [--exporter NAME] [--endpoint E]
                                   [--host-facts FACTS] [-o FORMAT]
       qemu-ssh-provisioner render -f MANIFESTS.yaml [-f ...] [--exporter NAME] [--endpoint E] [--host-facts FACTS]
                                   [-o FORMAT]

Prints, for each ExporterSet in the files, what run would write on its lab host: the ExporterConfig and the two
quadlets with their paths, the volume and the units. Offline: nothing is read from a cluster or a host. The set's
VirtualTargetClass (spec.virtualTargetClassName, same namespace) must be in the files too.

  --class FILE, --set FILE, -f FILE   manifests (-f is also --file), YAML, any number of documents; repeatable;
                                      - reads them from stdin
  --exporter NAME                     the Exporter's name (default SET-xxxxx); only with a single ExporterSet
  --endpoint HOST:PORT                the Jumpstarter endpoint for the ExporterConfig (default <endpoint>)
  --host-facts FACTS                  the lab host's facts the files are for, as the apply prints them
                                      ("podman=5.4.2 kvm=660:993": Podman version, /dev/kvm mode and gid, or
                                      kvm=none); default: none known, as for a host run has not reached yet
  -o, --output text|yaml|json         text (default): a header and each file under a ==> PATH <== line;
                                      yaml, json: a list with one entry per ExporterSet (exporterSet, class,
                                      exporter, host, volume, units, files with path, mode, owner, links, content)

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
  /** All of stdin (`render -f -`); absent: the process's. */
  stdin?(): Promise<string>;
}

export const consoleIo: Io = { out: (t) => console.log(t), err: (t) => console.error(t) };

const readStdin = () => new Response(Deno.stdin.readable).text();
/** How a manifest read from stdin is named in messages. */
export const STDIN_NAME = "<stdin>";

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

export const RENDER_FORMATS = ["text", "yaml", "json"] as const;
export type RenderFormat = typeof RENDER_FORMATS[number];

export interface RenderFlags {
  /** Paths; "-" is stdin. */
  files: string[];
  exporter?: string;
  endpoint?: string;
  hostFacts?: HostFacts;
  output: RenderFormat;
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
      "host-facts": { type: "string" },
      output: { type: "string", short: "o", default: "text" },
    },
  });
  if (positionals.length) throw new Error(`unexpected argument "${positionals[0]}"`);
  const files = [...values.class, ...values.set, ...values.file];
  if (!files.length) throw new Error("no manifests: give --class CLASS.yaml --set SET.yaml, or -f MANIFESTS.yaml");
  if (files.filter((f) => f === "-").length > 1) throw new Error("- (stdin) can be given only once");
  const output = values.output as RenderFormat;
  if (!RENDER_FORMATS.includes(output)) {
    throw new Error(`-o/--output must be ${RENDER_FORMATS.join(", ")}, got "${values.output}"`);
  }
  const facts = values["host-facts"];
  const hostFacts = facts === undefined ? undefined : parseFacts(facts);
  if (facts !== undefined && !hostFacts) {
    throw new Error(
      `--host-facts must look like "podman=5.4.2 kvm=660:993" or "podman=5.4.2 kvm=none", got "${facts}"`,
    );
  }
  return { files, exporter: values.exporter, endpoint: values.endpoint, hostFacts, output };
}

export async function renderCommand(args: string[], io: Io = consoleIo): Promise<number> {
  const flags = parseFlags(RENDER_USAGE, args, io, parseRenderFlags);
  if (typeof flags === "number") return flags;
  const sources: Manifest[] = [];
  for (const path of flags.files) {
    const name = path === "-" ? STDIN_NAME : path;
    try {
      sources.push({
        path: name,
        text: path === "-" ? await (io.stdin ?? readStdin)() : await Deno.readTextFile(path),
      });
    } catch (e) {
      io.err(`${name}: cannot read: ${e instanceof Error ? e.message : e}`);
      return 1;
    }
  }
  const result = renderManifests(sources, flags);
  for (const w of result.warnings) io.err(`warning: ${w}`);
  if (!result.ok) {
    for (const e of result.errors) io.err(e);
    return 1;
  }
  if (flags.output === "text") io.out(result.text);
  else {
    const list = result.instances.map(structured);
    io.out(flags.output === "json" ? JSON.stringify(list, null, 2) : stringify(list, { lineWidth: 0 }).trimEnd());
  }
  return 0;
}

/** One rendered set for `-o yaml|json`: what the text format says, as data. */
function structured(r: RenderedSet) {
  return {
    exporterSet: `${r.namespace}/${r.set.metadata.name}`,
    virtualTargetClass: r.set.spec.virtualTargetClassName,
    exporter: r.rendered.name,
    host: r.host,
    volume: r.rendered.volume,
    units: r.rendered.units,
    files: r.rendered.files.map((f) => ({
      path: f.path,
      mode: f.mode.toString(8).padStart(4, "0"),
      owner: f.owner,
      links: f.links,
      content: f.content,
    })),
  };
}

export interface Manifest {
  /** Where the text came from, for messages. */
  path: string;
  text: string;
}

/** One ExporterSet as run would deploy a new Exporter of it. */
export interface RenderedSet {
  set: ExporterSet;
  namespace: string;
  /** user@host:port */
  host: string;
  rendered: RenderedInstance;
}

export type RenderResult =
  | { ok: true; text: string; instances: RenderedSet[]; warnings: string[] }
  | { ok: false; errors: string[]; warnings: string[] };

/** Renders every ExporterSet in the manifests with its class, as `run` would deploy a new Exporter of it. Pure. */
export function renderManifests(
  manifests: Manifest[],
  opts: { exporter?: string; endpoint?: string; hostFacts?: HostFacts } = {},
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

  const out: RenderedSet[] = [];
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
        instanceOf({ ...set, metadata: { ...set.metadata, namespace: ns } }, cls, resolved.params, {
          name: opts.exporter ?? `${set.metadata.name}-xxxxx`,
          uid: PLACEHOLDER_UID,
          endpoint: opts.endpoint ?? PLACEHOLDER_ENDPOINT,
          token: REDACTED,
          caBundle: "",
        }),
        opts.hostFacts,
      );
      const { host } = resolved.params;
      out.push({
        set,
        namespace: ns,
        rendered,
        host: targetString({ user: host.user, host: host.name, port: host.port }),
      });
    } catch (e) {
      // names and the endpoint are checked only here, as they become file names and unit file values
      errors.push(`ExporterSet ${set.metadata.name}: ${e instanceof Error ? e.message : e}`);
    }
  }
  if (errors.length) return { ok: false, errors, warnings };
  const text = out.map((r) => describe(r.set, r.namespace, r.rendered, r.host)).join("\n\n");
  return { ok: true, text, instances: out, warnings };
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
