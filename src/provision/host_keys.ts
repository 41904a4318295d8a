/**
 * Trust on first use: the SSH pool reports a host key it accepted, and it is pinned in the namespace's Secret. The pool
 * judged "first use" from a cache that may lag, so the Secret as the API server has it decides: one key per host:port.
 */
import { Buffer } from "node:buffer";
import type { Secret } from "../api/types.ts";
import { isConflict, type KubeApi, KubeError } from "../kube/client.ts";
import { SECRETS } from "../kube/resources.ts";
import { checkHostKey } from "../host/known_hosts.ts";
import { hostKeyError, SshError } from "../host/ssh.ts";
import { decodeSecretValue, type LabTarget, PINNED_HOST_KEYS_KEY, PINNED_HOST_KEYS_SECRET } from "./credentials.ts";

/**
 * Records a host key seen for the first time in the namespace's pin Secret; throws a host key error naming both
 * fingerprints when the Secret already pins another key for the host:port. `line` is the pool's known_hosts line.
 * manifests/known-hosts-secret.yaml ships the Secret empty, so the Role needs only get and patch on it; a missing one
 * is created where the Role allows it (the Jumpstarter operator's does), else the error says to apply that file.
 */
export async function pinHostKey(client: KubeApi, target: LabTarget, line: string): Promise<void> {
  const presented = line.split(" ")[2];
  for (let attempt = 0; attempt < 5; attempt++) {
    const current = await client.find<Secret>(SECRETS, target.namespace, PINNED_HOST_KEYS_SECRET);
    const text = decodeSecretValue(current, PINNED_HOST_KEYS_KEY) ?? "";
    const verdict = checkHostKey(text, target.host, target.port, presented);
    if (verdict.status === "match") return;
    if (verdict.status !== "unknown") {
      const refusal = hostKeyError(target, verdict);
      const where = `${target.namespace}/${PINNED_HOST_KEYS_SECRET}`;
      throw new SshError("hostkey", target, `${refusal.message} The recorded key is pinned in Secret ${where}.`);
    }
    const data = {
      [PINNED_HOST_KEYS_KEY]: Buffer.from(`${text}${text && !text.endsWith("\n") ? "\n" : ""}${line}\n`).toString(
        "base64",
      ),
    };
    try {
      if (!current) {
        await client.create<Secret>(SECRETS, {
          metadata: { name: PINNED_HOST_KEYS_SECRET, namespace: target.namespace },
          type: "Opaque",
          data,
        }).catch((e) => {
          if (!(e instanceof KubeError && e.status === 403)) throw e;
          throw new Error(
            `cannot pin the host key of ${target.host}: Secret ${target.namespace}/${PINNED_HOST_KEYS_SECRET} does ` +
              `not exist and the controller may not create Secrets: create it empty (manifests/` +
              `known-hosts-secret.yaml, or kubectl create secret generic ${PINNED_HOST_KEYS_SECRET} -n ` +
              `${target.namespace}), or add the host's key to known_hosts in the credentials Secret`,
          );
        });
      } else {
        await client.mergePatch(SECRETS, target.namespace, PINNED_HOST_KEYS_SECRET, {
          metadata: { resourceVersion: current.metadata.resourceVersion },
          data,
        });
      }
      return;
    } catch (e) {
      // someone else pinned at the same time (the write is conditional on what we read): read again
      if (!isConflict(e)) throw e;
    }
  }
  throw new Error(
    `could not pin the host key of ${target.host} in Secret ${target.namespace}/${PINNED_HOST_KEYS_SECRET}`,
  );
}
