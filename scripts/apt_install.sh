#!/usr/bin/env bash
# Install one Debian package for a tool the project can use, quietly and idempotently:
#   scripts/apt_install.sh NAME COMMAND PACKAGE [FALLBACK]
# does nothing when COMMAND is already on PATH; installs PACKAGE with apt-get when running as
# root with apt-get available; otherwise prints why it cannot (and FALLBACK, what happens
# instead) and exits 0, so that callers degrade gracefully. NAME prefixes the messages.
set -u
name=$1 cmd=$2 pkg=$3 fallback=${4:-}
suffix=${fallback:+; $fallback}

if command -v "$cmd" >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "$name: not root, cannot install $pkg (ask an admin: apt-get install $pkg)$suffix"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "$name: apt-get not found, cannot install $pkg$suffix"
    exit 0
fi

export DEBIAN_FRONTEND=noninteractive
log="$(mktemp)"
if apt-get install -y -qq --no-install-recommends "$pkg" >"$log" 2>&1 \
   || { apt-get update -qq >>"$log" 2>&1 \
        && apt-get install -y -qq --no-install-recommends "$pkg" >>"$log" 2>&1; }; then
    rm -f "$log"
    echo "$name: installed $pkg ($(command -v "$cmd"))"
    exit 0
fi
echo "$name: apt-get could not install $pkg (last lines of its log below)$suffix"
tail -n 5 "$log"
rm -f "$log"
exit 0
