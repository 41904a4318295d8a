# stage: puts the exporter image's launcher on an instance's shared volume, before its runtime starts (the runtime
# quadlet's ExecStartPre, render.ts stageCommand). Every apply writes it to the host after a header (remote.ts
# STAGE_SCRIPT_TEXT) that sets LAUNCHERS (the host's cache: one directory per exporter image id), EXEC_IN_IMAGE
# (where the exporter image carries the launcher) and STAGED (its name on the volume). Run as `/bin/sh SCRIPT PULL
# IMAGE VOLUME CONTAINER`: PULL is Podman's pull policy for the image (always, missing, never, newer), VOLUME the
# shared volume, CONTAINER the name of the instance's temporary container the launcher is copied out of (render.ts
# stageContainer). No container runs: the launcher is copied out of an image once per image id, and only copied onto
# the volume at each start, so a new image (a floating tag updated) brings its own. It keeps systemd's PATH, which
# finds podman as the quadlet's own podman command does.
set -eu
export LC_ALL=C
if [ $# != 4 ]; then
  echo "stage: usage: stage-launcher.sh PULL IMAGE VOLUME CONTAINER" >&2
  exit 2
fi
pull=$1 image=$2 volume=$3 container=$4
tmp=
trap '[ -z "$tmp" ] || rm -f "$tmp"' EXIT
# systemd stops a start that times out with SIGTERM: the EXIT trap still removes the temp file
trap 'exit 143' HUP INT TERM

# the local image's id, empty when there is none: the one podman call a start of an image already here needs
local_id() { podman image inspect --format '{{.Id}}' "$image" 2>/dev/null || true; }
# Podman 4 has no `pull --policy`: the policies as `podman run --pull` reads them.
case "$pull" in
always)
  podman pull -q "$image" >/dev/null
  id=$(local_id)
  ;;
missing)
  id=$(local_id)
  if [ -z "$id" ]; then
    podman pull -q "$image" >/dev/null
    id=$(local_id)
  fi
  ;;
newer)
  # the registry's digest when it answers; the local image when it does not
  pulled=1
  why=$(podman pull -q "$image" 2>&1 >/dev/null) || pulled=0
  id=$(local_id)
  if [ -z "$id" ]; then
    printf '%s\n' "$why" >&2
    exit 1
  fi
  if [ "$pulled" = 0 ]; then printf 'stage: %s: not pulled, the local image is used: %s\n' "$image" "$why" >&2; fi
  ;;
never)
  id=$(local_id)
  if [ -z "$id" ]; then
    echo "stage: the exporter image $image is not on this host and its imagePullPolicy is Never: pull it there \
(podman pull $image) or allow pulling it" >&2
    exit 1
  fi
  ;;
*)
  echo "stage: unknown pull policy $pull" >&2
  exit 2
  ;;
esac
case "$id" in
'' | *[!0-9a-f]*)
  echo "stage: podman gave $image the image id '$id', not a hex digest" >&2
  exit 1
  ;;
esac

# Once per image id. Written beside its final name and renamed, so neither a crash nor a runtime staging the same
# image at the same time ever leaves a half file there. `podman cp` resolves a symlink inside the image, as `cp` in
# the image did. The container is never started; --replace takes the place of one a crash left.
cached=$LAUNCHERS/$id/$STAGED
if [ ! -f "$cached" ]; then
  mkdir -p "${cached%/*}"
  tmp=$(mktemp -u "${cached%/*}/.$STAGED.qsp-tmp.XXXXXX")
  podman create --replace --name "$container" --pull never --network none --entrypoint "$EXEC_IN_IMAGE" "$id" \
    >/dev/null
  podman cp "$container:$EXEC_IN_IMAGE" "$tmp"
  podman rm -f -v "$container" >/dev/null
  chmod 0755 "$tmp"
  sync "$tmp"
  mv -f "$tmp" "$cached"
  tmp=
fi

# At each start, so the volume's copy is the image's whatever happened to it. The exporter is down meanwhile (it is
# bound to the runtime), so nothing executes the file replaced.
mp=$(podman volume inspect --format '{{.Mountpoint}}' "$volume")
tmp=$(mktemp "$mp/.$STAGED.qsp-tmp.XXXXXX")
cp "$cached" "$tmp"
chmod 0755 "$tmp"
mv -f "$tmp" "$mp/$STAGED"
tmp=
