#!/usr/bin/env bash
# Install headless Chromium for the MLflow UI check (tests/test_mlflow_ui.py).
#
# Idempotent and quiet: prints nothing and exits 0 when chromium is already on PATH; installs
# the Debian package `chromium` with apt-get when running as root with apt-get available;
# otherwise prints why it cannot install and exits 0 (the browser test then skips, naming
# the reason). Set CHROMIUM to use another binary.
set -u

if command -v "${CHROMIUM:-chromium}" >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "install_chromium: not root, cannot install chromium (ask an admin: apt-get install chromium)"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_chromium: apt-get not found, cannot install chromium"
    exit 0
fi

export DEBIAN_FRONTEND=noninteractive
log="$(mktemp)"
if apt-get install -y -qq --no-install-recommends chromium >"$log" 2>&1 \
   || { apt-get update -qq >>"$log" 2>&1 \
        && apt-get install -y -qq --no-install-recommends chromium >>"$log" 2>&1; }; then
    rm -f "$log"
    echo "install_chromium: installed chromium ($(command -v chromium))"
    exit 0
fi
echo "install_chromium: apt-get could not install chromium (last lines of its log below)"
tail -n 5 "$log"
rm -f "$log"
exit 0
