/**
 * The sandbox's Jumpstarter client config (what `jmp admin create client --out` wrote), brought up to date with the
 * running controller: v0.7.1 serves a new self-signed certificate on every start, and `jmp` verifies the endpoint
 * against `tls.ca` (base64 of the PEM bundle, as `jmp admin create client` writes it). The token stays: the
 * controller's signing keys are kept across its restarts.
 */
import { Buffer } from "node:buffer";
import { parseDocument } from "yaml";

export function refreshedClientConfig(yaml: string, running: { endpoint: string; caPem: string }): string {
  const doc = parseDocument(yaml);
  if (doc.errors.length || !doc.has("token")) {
    throw new Error(`the client config is not one \`jmp admin create client\` wrote: ${doc.errors[0] ?? "no token"}`);
  }
  doc.set("endpoint", running.endpoint);
  doc.setIn(["tls", "ca"], Buffer.from(running.caPem).toString("base64"));
  return doc.toString();
}
