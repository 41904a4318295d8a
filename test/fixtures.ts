/** Shared test data: what the feature description's class and set resolve to, and one instance of them. */
import type { InstanceParams } from "../src/host/instance_params.ts";
import type { Instance } from "../src/host/render.ts";

/** What the seed's VirtualTargetClass + ExporterSet resolve to (params_test.ts checks that). */
export const seedParams: InstanceParams = {
  host: { name: "lab-host-01.example.com", user: "root", port: 22 },
  runtime: { kvm: true, devices: [] },
  arch: "aarch64",
  cpu: 4,
  memory: "4Gi",
  storage: "16Gi",
  // 16Gi plus the default 10%
  diskBytes: 18023 * 2 ** 20,
  images: {
    exporter: { image: "quay.io/jumpstarter-dev/jumpstarter:latest", pullPolicy: "IfNotPresent" },
    runtime: { image: "quay.io/jumpstarter-dev/virtual/qemu-runtime:latest", pullPolicy: "IfNotPresent" },
  },
};

export const PEM = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUX\n-----END CERTIFICATE-----\n";

export function seedInstance(over: Partial<Instance> = {}): Instance {
  return {
    namespace: "jumpstarter",
    name: "aarch64-ssh-pool-x7k2p",
    uid: "0b7e6c1a-5f7d-4a8e-9c39-2f1d7e0a6b11",
    setName: "aarch64-ssh-pool",
    params: seedParams,
    drivers: [{ name: "qemu", type: "jumpstarter_driver_qemu.driver.Qemu" }],
    exitOnLeaseEnd: true,
    endpoint: "grpc.jumpstarter.example.com:443",
    token: "eyJhbGciOiJSUzI1NiJ9.payload.signature",
    caBundle: PEM,
    ...over,
  };
}

/** A new ed25519 private key in OpenSSH's format, made by ssh-keygen (the format lab hosts' sshd takes). */
export async function ed25519Key(comment: string): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "qsp-key-" });
  try {
    const r = await new Deno.Command("ssh-keygen", {
      args: ["-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", `${dir}/key`],
      stdout: "null",
    }).output();
    if (!r.success) throw new Error("ssh-keygen failed");
    return await Deno.readTextFile(`${dir}/key`);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}
