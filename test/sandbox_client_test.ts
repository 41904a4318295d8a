import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import { parse } from "yaml";
import { refreshedClientConfig } from "./sandbox_client.ts";

// As jumpstarter-cli-admin 0.9.0 writes it.
const WRITTEN = `apiVersion: jumpstarter.dev/v1alpha1
kind: ClientConfig
metadata:
  namespace: jumpstarter
  name: sandbox
endpoint: 10.77.0.1:8082
tls:
  ca: T0xEIENB
  insecure: false
token: eyJhbGciOiJFUzI1NiJ9.e30.sig
grpcOptions: {}
drivers:
  allow: []
  unsafe: true
`;

Deno.test("sandbox client config: the running controller's CA and endpoint, everything else as written", () => {
  const pem = "-----BEGIN CERTIFICATE-----\nNEW\n-----END CERTIFICATE-----\n";
  const out = parse(refreshedClientConfig(WRITTEN, { endpoint: "10.76.70.1:8082", caPem: pem }));
  const before = parse(WRITTEN);
  assert.equal(Buffer.from(out.tls.ca, "base64").toString(), pem);
  assert.equal(out.endpoint, "10.76.70.1:8082");
  assert.deepEqual({ ...out, endpoint: before.endpoint, tls: before.tls }, before);
  assert.equal(out.tls.insecure, false);
});

Deno.test("sandbox client config: a file that is not a client config is refused, not patched", () => {
  assert.throws(() => refreshedClientConfig("endpoint: x\n", { endpoint: "e", caPem: "p" }), /no token/);
});
