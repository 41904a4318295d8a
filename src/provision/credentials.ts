/**
 * From the class's credentials Secret (and the host keys this controller pinned) to an SSH target. Pure.
 *
 * Host-key policy: `parameters.ssh.hostKeyPolicy` wins; otherwise Strict when the Secret carries `known_hosts`,
 * AcceptNew (trust on first use, pinned in the `qemu-ssh-known-hosts` Secret of the namespace) when it does not,
 * so the seed's `kubectl create secret generic lab-ssh-key --from-file=ssh-privatekey=...` works as written. The
 * Secret is the class's, so its `known_hosts` is the class's policy: a set's policy only ever reaches here when it
 * is stricter (overrides.ts).
 */
import { Buffer } from "node:buffer";
import type { Secret, VirtualTargetClass } from "../api/types.ts";
import { checkPrivateKey } from "../host/ssh_key.ts";
import type { HostKeyPolicy, SshTarget } from "../host/ssh.ts";
import type { InstanceParams } from "../host/instance_params.ts";
import type { Problem } from "./status.ts";

export const PINNED_HOST_KEYS_SECRET = "qemu-ssh-known-hosts";
export const PINNED_HOST_KEYS_KEY = "known_hosts";
const PRIVATE_KEY = "ssh-privatekey";
const KNOWN_HOSTS = "known_hosts";

/** An SSH target plus where its trust-on-first-use pins go. */
export interface LabTarget extends SshTarget {
  namespace: string;
}

export function decodeSecretValue(secret: Secret | undefined, key: string): string | undefined {
  const v = secret?.data?.[key];
  return v === undefined ? undefined : Buffer.from(v, "base64").toString("utf8");
}

export function sshTarget(
  cls: VirtualTargetClass,
  params: InstanceParams,
  credentials: Secret | undefined,
  pinned: Secret | undefined,
): { ok: true; target: LabTarget; tofu: boolean } | { ok: false; problem: Problem } {
  const ns = cls.metadata.namespace!;
  const ref = cls.spec.credentialsSecretRef?.name;
  const where = `VirtualTargetClass ${ns}/${cls.metadata.name}`;
  if (!ref) {
    return problem(
      "CredentialsMissing",
      `${where} has no spec.credentialsSecretRef: create a Secret with the SSH key (key ${PRIVATE_KEY}) and name it there`,
    );
  }
  if (!credentials) {
    return problem(
      "CredentialsNotFound",
      `Secret ${ns}/${ref} (spec.credentialsSecretRef of ${where}) not found: create it with ` +
        `kubectl create secret generic ${ref} --from-file=${PRIVATE_KEY}=$HOME/.ssh/id_ed25519 -n ${ns}`,
    );
  }
  const privateKey = decodeSecretValue(credentials, PRIVATE_KEY);
  if (privateKey === undefined) {
    const keys = Object.keys(credentials.data ?? {}).join(", ") || "none";
    return problem(
      "CredentialsInvalid",
      `Secret ${ns}/${ref} has no "${PRIVATE_KEY}" key (it has: ${keys}): store the private key under that key`,
    );
  }
  const check = checkPrivateKey(privateKey);
  if (!check.ok) return problem("CredentialsInvalid", `Secret ${ns}/${ref} key "${PRIVATE_KEY}": ${check.reason}`);
  const given = decodeSecretValue(credentials, KNOWN_HOSTS) ?? "";
  const pins = decodeSecretValue(pinned, PINNED_HOST_KEYS_KEY) ?? "";
  const policy: HostKeyPolicy = params.hostKeyPolicy ?? (given.trim() ? "Strict" : "AcceptNew");
  return {
    ok: true,
    tofu: policy === "AcceptNew" && !given.trim(),
    target: {
      namespace: ns,
      host: params.host.name,
      port: params.host.port,
      user: params.host.user,
      privateKey,
      // Pins count only under AcceptNew: Strict means exactly what the user gave.
      knownHosts: policy === "AcceptNew" ? `${given}\n${pins}` : given,
      hostKeyPolicy: policy,
      pinScope: ns,
    },
  };
}

/**
 * The credentials an instance was deployed with, from the Secret its Exporter recorded (targets.ts
 * CREDENTIALS_ANNOTATION), for a teardown once no class names that Secret any more: the class deleted first, and the
 * process's memory of the key lost in a restart. The class took its host-key policy with it, so the host must show a
 * key the Secret's known_hosts or this namespace's pins already hold: a teardown trusts no new host key.
 */
export function recordedTarget(
  ns: string,
  host: Pick<SshTarget, "host" | "port" | "user">,
  credentials: Secret | undefined,
  pinned: Secret | undefined,
): LabTarget | undefined {
  const privateKey = decodeSecretValue(credentials, PRIVATE_KEY);
  if (privateKey === undefined || !checkPrivateKey(privateKey).ok) return undefined;
  const given = decodeSecretValue(credentials, KNOWN_HOSTS) ?? "";
  const pins = decodeSecretValue(pinned, PINNED_HOST_KEYS_KEY) ?? "";
  return {
    namespace: ns,
    ...host,
    privateKey,
    knownHosts: `${given}\n${pins}`,
    hostKeyPolicy: "Strict",
    pinScope: ns,
  };
}

function problem(reason: string, message: string): { ok: false; problem: Problem } {
  return { ok: false, problem: { reason, message } };
}
