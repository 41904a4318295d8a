# Sourced by the build scripts whose products live in the cache (~/.cache/qemu-ssh-provisioner): they print the
# product's path as the last line of stdout (fd 3), and any number of runs may ask for it at once.
#
# cached_or_locked COMPLETE OUT DIR: if the command COMPLETE says OUT is built, print OUT and exit; otherwise take the
# build lock DIR/build.lock (fd 9, held until the script exits) and check again, since another run may have finished
# the build while this one waited.
cached_or_locked() {
  local complete=$1 out=$2 dir=$3
  if "$complete"; then
    echo "$out" >&3
    exit 0
  fi
  mkdir -p "$dir"
  exec 9>"$dir/build.lock"
  if ! flock -n 9; then
    echo "${0##*/}: waiting for another build of $out" >&2
    flock 9
  fi
  if "$complete"; then
    echo "$out" >&3
    exit 0
  fi
}
