#!/bin/bash
# debian-mirror.sh - prints the Debian mirror URL to debootstrap from: $DEBIAN_MIRROR, else the first Debian archive
# in this machine's apt sources, else deb.debian.org. Only the URL is reused: the outer machine's suite (bookworm)
# does not matter, the callers debootstrap trixie from it.
set -u # missing source files are normal, so no -e/pipefail
if [ -n "${DEBIAN_MIRROR:-}" ]; then
    echo "${DEBIAN_MIRROR%/}"
    exit 0
fi
# one-line "deb [opts] URI ..." entries, then deb822 "URIs:" fields; a Debian archive's path ends in /debian
# (debian-security and third-party repositories do not)
{
    cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
        sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]\+\).*/\2/p'
    cat /etc/apt/sources.list.d/*.sources 2>/dev/null | sed -n 's/^URIs:[[:space:]]*//p' | tr -s ' \t' '\n'
} | sed 's:/*$::' |
    awk '!f && /^(https?|file):.*\/debian$/ { print; f = 1 } END { if (!f) print "http://deb.debian.org/debian" }'
