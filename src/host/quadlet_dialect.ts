/**
 * What a host's quadlet generator understands, from its `podman --version`. Pure. Each threshold is the first
 * release whose `pkg/systemd/quadlet/quadlet.go` has the key or form (read at the release tags):
 *   4.4  quadlet itself (the `[Container]` keys Image, ContainerName, Label, Volume, AddDevice, User, Group,
 *        Environment, Exec, Network, PodmanArgs)
 *   4.6  `Pull=`, and `AddDevice=-PATH` for a device that may be missing (before, the `-` reaches podman as part of
 *        the path)
 *   5.1  `GroupAdd=`, so the exporter's kvm group goes in `PodmanArgs=` (an older quadlet rejects the whole unit for
 *        an unknown key)
 *   5.4  `Network=<name>.container`, the network namespace of the container another quadlet runs. It appeared in
 *        5.3 (podman commit 71fd157), but 5.3's generator learns a container's name only when it converts that
 *        file, in directory order, and `<name>-exporter.container` sorts before `<name>-runtime.container`: "cannot
 *        get the resource name", no exporter service. 5.4 knows every container's name up front. Older ones pass
 *        the text to podman as a network name, and the exporter fails at start
 */

/** The oldest Podman with quadlet: older hosts are refused before anything is written. */
export const MIN_PODMAN: readonly [number, number] = [4, 4];

export interface QuadletDialect {
  /**
   * How the exporter joins the runtime's network namespace: `unit` is `Network=<runtime>.container` (quadlet adds
   * the ordering), `container` is `Network=container:<runtime ContainerName>` with the ordering written out.
   */
  network: "unit" | "container";
  /** `Pull=`; without it, `PodmanArgs=--pull=<policy>`. */
  pullKey: boolean;
  /** `AddDevice=-PATH`; without it an optional device can only be required. */
  optionalDevice: boolean;
}

/** The newest dialect: for a Podman whose version is not a number (a development build) or not known. */
export const NEWEST_DIALECT: QuadletDialect = { network: "unit", pullKey: true, optionalDevice: true };

/** The dialect of MIN_PODMAN, the oldest quadlet. */
export const OLDEST_DIALECT: QuadletDialect = { network: "container", pullKey: false, optionalDevice: false };

/** `[major, minor]` of a `podman --version` number (`4.9.3`, `5.3.0-rc1`, `4.3.1+ds1-8`); undefined if none. */
export function podmanVersionParts(version: string): [number, number] | undefined {
  const m = /^([0-9]+)\.([0-9]+)/.exec(version);
  return m ? [Number(m[1]), Number(m[2])] : undefined;
}

const atLeast = ([major, minor]: [number, number], [m, n]: readonly [number, number]) =>
  major > m || (major === m && minor >= n);

/**
 * The dialect of a Podman version, or `too-old` below MIN_PODMAN (no quadlet at all). A version that is not a number
 * gets the newest dialect, as the apply script lets it through.
 */
export function quadletDialect(version: string): QuadletDialect | "too-old" {
  const v = podmanVersionParts(version);
  if (!v) return NEWEST_DIALECT;
  if (!atLeast(v, MIN_PODMAN)) return "too-old";
  return {
    network: atLeast(v, [5, 4]) ? "unit" : "container",
    pullKey: atLeast(v, [4, 6]),
    optionalDevice: atLeast(v, [4, 6]),
  };
}

/** One line for people (doctor, README): how the exporter is put into the runtime's network on this dialect. */
export function networkFormText(d: QuadletDialect): string {
  return d.network === "unit"
    ? "Network=<name>-runtime.container"
    : "Network=container:<name>-runtime with Requires/After/BindsTo on <name>-runtime.service";
}
