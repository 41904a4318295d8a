/**
 * qemu-ssh-provisioner: the qemu-ssh.jumpstarter.dev provisioner for Jumpstarter ExporterSets.
 *
 * A launcher. The process starts with broad permissions (scripts/permissions.sh) because what it must reach is
 * known only from the deployment's flags and environment: the API server, the lab hosts, the listeners. It decides
 * that set (src/cli/permissions.ts) and runs the command in a Worker narrowed to it. Out here the only npm code is
 * npm:yaml, which reads the kubeconfig (src/kube/kubeconfig_needs.ts) to learn the hosts and files it names; it does
 * no I/O of its own beyond two debug variables it reads (LOG_TOKENS, LOG_STREAM). ssh2 and the controller load in the
 * Worker only.
 * This module is its own Worker, so the air-gapped bundle and the compiled binary stay one file.
 */
import { commandPermissions, type Facts } from "./src/cli/permissions.ts";

interface Start {
  argv: string[];
  permissions: Deno.PermissionOptionsObject;
}

if ("WorkerGlobalScope" in globalThis) {
  const scope = globalThis as unknown as {
    onmessage: ((e: MessageEvent<Start>) => void) | null;
    postMessage(code: number): void;
  };
  scope.onmessage = async (e) => {
    scope.onmessage = null;
    const { cli } = await import("./src/cli/main.ts");
    scope.postMessage(await cli(e.data.argv, e.data.permissions));
  };
} else if (import.meta.main) {
  const facts: Facts = {
    env: Deno.env.toObject(),
    home: Deno.env.get("HOME"),
    readFile(path) {
      try {
        return Deno.readTextFileSync(path);
      } catch {
        return undefined;
      }
    },
    // the source tree for `deno run main.ts`; the file itself for the bundle
    code: import.meta.url.endsWith(".ts") ? new URL(".", import.meta.url).pathname : import.meta.filename!,
  };
  const permissions = commandPermissions(Deno.args, facts);
  const worker = new Worker(import.meta.url, { type: "module", name: "qemu-ssh-provisioner", deno: { permissions } });
  worker.onmessage = (e: MessageEvent<number>) => Deno.exit(e.data);
  worker.onerror = (e) => {
    e.preventDefault();
    console.error(`error: ${e.message}`);
    Deno.exit(1);
  };
  worker.postMessage({ argv: Deno.args, permissions } satisfies Start);
}
