#!/bin/sh
# `deno task check`'s ShellCheck of the host scripts (src/host/scripts), as POSIX sh: each script as remote.ts sends it,
# lib.sh then its own steps (its header's values are uppercase, which ShellCheck takes as set elsewhere), with every
# finding named by its own file and line; stage.sh, which runs on its own after a header of constants (remote.ts
# STAGE_SCRIPT_TEXT), alone. Then the other shell the repository ships, as the shell it names.
set -eu
cd "$(dirname "$0")/.."
command -v shellcheck >/dev/null || {
  echo "shellcheck is not installed: bash test/prepare.sh installs it (or apt-get install shellcheck)" >&2
  exit 1
}
dir=src/host/scripts
lib_lines=$(wc -l <"$dir/lib.sh")
status=0
for s in apply remove inspect; do
  cat "$dir/lib.sh" "$dir/$s.sh" | shellcheck -s sh -f gcc - |
    awk -v lib="$dir/lib.sh" -v own="$dir/$s.sh" -v n="$lib_lines" -F: '{
      line = $2 + 0; file = lib; if (line > n) { file = own; line -= n }
      sub(/^-:[0-9]+:/, ""); print file ":" line ":" $0; bad = 1
    } END { exit bad }' || status=1
done
shellcheck -s sh "$dir/stage.sh" || status=1
shellcheck scripts/*.sh || status=1
exit $status
